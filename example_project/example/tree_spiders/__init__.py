# Crawl-tree spiders of the ``trees`` project (example.tree_settings): explore and tree_summary.
