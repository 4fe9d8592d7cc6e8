"""A job's statuses and outcomes: names the node's idle path needs without the ORM models (``models.py``)."""

# A delayed job waits for its run_at (_run_at, _delay, a retry's backoff); the API shows it as pending.
DELAYED, PENDING, ONGOING, TERMINATED = "delayed", "pending", "ongoing", "terminated"
STATUSES = (DELAYED, PENDING, ONGOING, TERMINATED)

# How a terminated job ended. "lost": recovery gave up after max_attempts claims by nodes that died;
# "interrupted": its node stopped (SIGTERM) before the crawl ended; "cancelled": cancel.json; "dead": it failed
# once more than its _retries allowed (requeue --dead sends it back).
FINISHED, FAILED, CANCELLED, LOST, INTERRUPTED, DEAD = "finished", "failed", "cancelled", "lost", "interrupted", "dead"
OUTCOMES = (FINISHED, FAILED, CANCELLED, LOST, INTERRUPTED, DEAD)
