"""Scrapyd's components over the shared tables, one small module each as in Scrapyd: the queue (``spiderqueue``),
the job storage (``jobstorage``), the poller that claims (``poller``), the launcher that runs crawls (``launcher``),
the egg storage (``eggstorage``). Configured by their top-level names, ``scrapyd_pgqueue.PostgresSpiderQueue``..."""
