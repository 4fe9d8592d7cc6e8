"""A job's statuses and outcomes: the names spider_job's status and outcome checks allow (``schema.sql``)."""

# A delayed job waits for its run_at (_run_at, _delay, a retry's backoff); the API shows it as pending.
DELAYED, PENDING, ONGOING, TERMINATED = "delayed", "pending", "ongoing", "terminated"
STATUSES = (DELAYED, PENDING, ONGOING, TERMINATED)

# How a terminated job ended. "lost": recovery gave up after max_attempts claims by nodes that died;
# "interrupted": its node stopped (SIGTERM) before the crawl ended; "cancelled": cancel.json; "dead": it failed
# once more than its _retries allowed (requeue --dead sends it back); "timeout": stopped by the node's watchdog past
# its _max_runtime; "stalled": stopped by the watchdog after _stall_timeout without a request, response or item.
FINISHED, FAILED, CANCELLED, LOST, INTERRUPTED, DEAD = "finished", "failed", "cancelled", "lost", "interrupted", "dead"
TIMEOUT, STALLED = "timeout", "stalled"
OUTCOMES = (FINISHED, FAILED, CANCELLED, LOST, INTERRUPTED, DEAD, TIMEOUT, STALLED)
# Outcomes that count as a failure for _retries: the job runs again while it has retries left, then ends "dead".
RETRIED_OUTCOMES = (FAILED, TIMEOUT, STALLED)
