"""The JSON services, Scrapyd's and the cluster's own, each answering for the whole cluster from the shared tables.

``jobs`` (schedule, status, listjobs, cancel, daemonstatus, logs), ``schedules`` (periodic jobs), ``trees``
(tree.json), ``stats`` (stats.json), ``eggs`` (Scrapyd's egg services off the reactor); ``resource`` is the base they
share and ``answers`` the JSON values they share with the operator command. Installed through the ``[services]``
section.
"""
