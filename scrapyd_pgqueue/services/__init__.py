"""The JSON services, Scrapyd's and the cluster's own, each answering for the whole cluster from the shared tables.

``jobs`` (schedule, status, listjobs, cancel, daemonstatus, logs), ``schedules`` (periodic jobs), ``trees``
(tree.json), ``eggs`` (Scrapyd's egg services off the reactor); ``resource`` is the base they share. Installed through
the ``[services]`` section; the former paths (``scrapyd_pgqueue.webservice.Schedule``...) stay importable as
deprecated aliases.
"""
