# The ``intruder`` project's spider (example.intruder_settings): what a hostile egg would try on the database.
