"""The node's web pages for the whole cluster: ``/jobs`` (Scrapyd's page, cluster-wide), ``/dashboard`` and
``/metrics``. ``root.Root`` (Scrapyd's ``webroot`` option, ``scrapyd_pgqueue.web.root.Root``) mounts them.

- ``page``: what every page shares: rendering off the reactor, the layout, escaping.
- ``jobs``: Scrapyd's jobs page with every node's jobs (ScrapydWeb reads it: stock columns first).
- ``dashboard`` and ``svg``: nodes, queue depth, throughput charts and failures, server-rendered.
- ``prometheus``: ``/metrics``, the Prometheus exposition: this node's counters and the cluster's gauges.
"""
