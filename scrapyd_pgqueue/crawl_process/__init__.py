"""The half of the cluster that runs inside a crawl process: its runner's warm start, its link to its node (crawl
trees, stats) and what it makes of itself. Nothing here imports Twisted's reactor (Scrapy installs its own in the
crawl) or the database layer (a crawl never connects); the node's halves are in ``node/``."""
