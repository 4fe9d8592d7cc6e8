"""The rules of a job request, with no SQL and no driver: what a client may ask to schedule, checked the same by
every way in (schedule.json, schedule_batch.json, a crawl's follow-ups, ``scrapyd-pgqueue enqueue``, periodic jobs),
before the store runs a statement.

- ``options``: ``JobOptions``, how a job is scheduled beside what it runs, and the values its fields may take.
- ``checks``: what the store can hold of a job (its names, priority and message), ``InvalidJobError`` otherwise.
- ``job_requests``: a request's fields and job objects checked (``RefusedJob``), as the message the queue stores.
- ``periodic_jobs``: ``PeriodicJob`` as the operator defines it, checked by the same rules.
- ``common_jobs``: the fast path of the common job object (typed decoding in C, the same rules).
- ``timing``: when a periodic job is due (pure functions).

The store imports these; nothing here imports the store or the connection layer.
"""
