"""The frontier: one crawl's requests, shared by its workers (jobs whose ``crawl`` names the crawl's first row).

A request is leased, never popped: a worker takes a few, and each stays ``leased`` by that worker's job until the
worker reports it done (its callback's output stored in the same transaction) or failed. A worker's job that leaves
``ongoing`` for any reason gives its leases back (the trigger ``spider_job_worker_left``, migration 0019), so a
worker that dies loses nothing. Deduplication is the database's: a unique index on (crawl, fingerprint), the
enqueue's ON CONFLICT target. A crawl is open while it has a ready request or a worker holds one: its end is the
moment both are gone, which the statement that acknowledges the last request decides.

The store handles requests as bytes (the crawl serialises them) with their fingerprint, priority and download slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import StorePerEngine, database_errors

# --- queries ---------------------------------------------------------------------------------------------------

# A batch of new requests, deduplicated against every request the crawl ever stored (crawl_request_seen_idx): one
# statement, the rows inserted in the batch's order (ids are the FIFO order among equal priorities). A NULL
# fingerprint (dont_filter) never conflicts. Its row count is the requests kept; the rest were duplicates.
STORE_REQUESTS = text("""
    INSERT INTO crawl_request (crawl, fingerprint, priority, slot, request)
    SELECT :crawl, r.fingerprint, r.priority, r.slot, r.request
    FROM unnest(CAST(:fingerprints AS bytea[]), CAST(:priorities AS integer[]), CAST(:slots AS text[]),
                CAST(:requests AS bytea[])) WITH ORDINALITY AS r(fingerprint, priority, slot, request, n)
    ORDER BY r.n
    ON CONFLICT (crawl, fingerprint) DO NOTHING
""")

# A crawl's leases are taken one worker at a time (a transaction-scoped advisory lock per crawl): each counts what the
# crawl's download slots hold, which two workers leasing at once would both count before either wrote.
LOCK_CRAWL_LEASES = text("SELECT pg_advisory_xact_lock(hashtextextended('crawl_request', :crawl))")

# A worker leases the crawl's next ready requests, LIMIT the room in its downloader, in order (highest priority, then
# first stored: the head of crawl_request_ready_idx, :scan rows at most), skipping a download slot (a host) once the
# crawl's workers hold :per_slot of its requests (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN or _PER_IP, for the whole
# crawl: a request is held until its callback's output is stored, so a slot never has more downloads in flight). What
# the slots hold is read from crawl_request_leased_idx alone. With a :delay (DOWNLOAD_DELAY, seconds), a slot gives
# one request per lease, and none before its next_lease_time, which the lease then moves on (crawl_slot); the clock is
# the statement's, not the transaction's, which may have waited for LOCK_CRAWL_LEASES. RETURNING gives no order.
LEASE_REQUESTS = text("""
    WITH leased AS (
        UPDATE crawl_request AS r SET status = 'leased', leased_by = :worker, attempts = r.attempts + 1
        FROM (
            SELECT head.id FROM (
                SELECT id, priority, slot, row_number() OVER (PARTITION BY slot ORDER BY priority DESC, id) AS nth
                FROM (SELECT id, priority, slot FROM crawl_request
                      WHERE crawl = :crawl AND status = 'ready'
                      ORDER BY priority DESC, id
                      LIMIT :scan) AS ready
            ) AS head
            LEFT JOIN (SELECT slot, count(*) AS held FROM crawl_request
                       WHERE crawl = :crawl AND status = 'leased'
                       GROUP BY slot) AS slots USING (slot)
            LEFT JOIN crawl_slot AS paced ON paced.crawl = :crawl AND paced.slot = head.slot
            WHERE head.nth <= :per_slot - coalesce(slots.held, 0)
              AND (CAST(:delay AS double precision) = 0
                   OR (head.nth = 1 AND coalesce(paced.next_lease_time <= clock_timestamp(), true)))
            ORDER BY head.priority DESC, head.id
            LIMIT :limit
        ) AS next
        WHERE r.id = next.id AND r.status = 'ready'
        RETURNING r.id, r.priority, r.request, r.slot
    ), paced AS (
        INSERT INTO crawl_slot (crawl, slot, next_lease_time)
        SELECT DISTINCT CAST(:crawl AS bigint), slot,
               clock_timestamp() + make_interval(secs => CAST(:delay AS double precision))
        FROM leased WHERE CAST(:delay AS double precision) > 0
        ON CONFLICT (crawl, slot) DO UPDATE SET next_lease_time = EXCLUDED.next_lease_time
    )
    SELECT id, priority, request FROM leased
""")
# Ready requests a lease looks at, from the head: past them, requests of other slots wait for a later step.
LEASE_SCAN = 1000

# Requests a worker has done: only its own leases (a request given back and leased by another meanwhile is theirs).
# The request's bytes go; the row and its fingerprint stay to deduplicate.
FINISH_REQUESTS = text("""
    UPDATE crawl_request SET status = 'done', request = NULL, done_time = now()
    WHERE id = ANY(CAST(:ids AS bigint[])) AND crawl = :crawl AND leased_by = :worker AND status = 'leased'
""")

# Requests that failed past Scrapy's retries, with their error; the request is kept, for an operator to look at.
FAIL_REQUESTS = text("""
    UPDATE crawl_request AS r SET status = 'failed', error = f.error, done_time = now()
    FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS f(id, error)
    WHERE r.id = f.id AND r.crawl = :crawl AND r.leased_by = :worker AND r.status = 'leased'
""")

# Whether the crawl still has work: a ready request, or one a worker holds. Two probes of the partial indexes.
CRAWL_OPEN = text("""
    SELECT EXISTS (SELECT 1 FROM crawl_request WHERE crawl = :crawl AND status = 'ready')
        OR EXISTS (SELECT 1 FROM crawl_request WHERE crawl = :crawl AND status = 'leased')
""")

# The crawl's requests by status, and those done in the last minute (its pace): one pass over the crawl's rows.
COUNT_REQUESTS = text("""
    SELECT count(*) FILTER (WHERE status = 'ready') AS ready, count(*) FILTER (WHERE status = 'leased') AS leased,
           count(*) FILTER (WHERE status = 'done') AS done, count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'done' AND done_time > now() - interval '1 minute') AS done_last_minute
    FROM crawl_request WHERE crawl = :crawl
""")

# The crawl named by its first worker's job id: the newest such row of the project (a job id may be used again once
# its job ended). Reads spider_job_job_idx.
FIND_CRAWL = text("""
    SELECT id FROM spider_job WHERE job = :job AND project = :project AND crawl = id ORDER BY id DESC LIMIT 1
""")

# The crawl's workers in the order they were scheduled, each with the duplicates its Scrapy counted
# (dupefilter/filtered: the requests the frontier already had). Reads spider_job_crawl_idx.
CRAWL_WORKERS = text("""
    SELECT job, status, outcome, node, coalesce(CAST(stats->>'dupefilter/filtered' AS bigint), 0) AS duplicates
    FROM spider_job WHERE crawl = :crawl ORDER BY id
""")

# A crawl's stats: the sum of its workers' numeric stats (each worker's Scrapy counts its own share of the crawl).
CRAWL_STATS = text("""
    SELECT s.key, sum(CAST(s.value AS numeric)) AS total
    FROM spider_job AS w, jsonb_each(w.stats) AS s
    WHERE w.crawl = :crawl AND jsonb_typeof(w.stats) = 'object' AND jsonb_typeof(s.value) = 'number'
    GROUP BY s.key ORDER BY s.key
""")

# The crawls with a worker not yet ended (at most :crawls, newest first), each with its first job, spider, workers
# running and in all, its ready requests counted up to :cap (crawl_request_ready_idx) and those held (a few per
# running worker, crawl_request_leased_idx). The crawls come from spider_job_crawl_idx: active workers and the kept
# finished ones bound them.
OPEN_CRAWLS = text("""
    SELECT c.job AS crawl, c.project, c.spider, o.running, o.workers,
           (SELECT count(*) FROM (SELECT 1 FROM crawl_request AS r
                                  WHERE r.crawl = c.id AND r.status = 'ready' LIMIT :cap) AS capped) AS queued,
           (SELECT count(*) FROM crawl_request AS r WHERE r.crawl = c.id AND r.status = 'leased') AS in_flight
    FROM (SELECT crawl, count(*) FILTER (WHERE status = 'ongoing') AS running, count(*) AS workers
          FROM spider_job WHERE crawl IS NOT NULL
          GROUP BY crawl
          HAVING bool_or(status <> 'terminated')
          ORDER BY crawl DESC
          LIMIT :crawls) AS o
    JOIN spider_job AS c ON c.id = o.crawl
    ORDER BY o.crawl DESC
""")
# Ready requests counted per crawl at most, and crawls listed at most, by OPEN_CRAWLS.
QUEUED_COUNT_CAP = 100_000
MAX_OPEN_CRAWLS = 200

# A crawl's jobs, all stored in the caller's transaction: each a worker of the crawl (its first job's row).
JOIN_CRAWL = text("UPDATE spider_job SET crawl = :crawl WHERE id = ANY(CAST(:ids AS bigint[]))")

# The crawl that new workers join: its spider, its first job's message (theirs too) and how many workers it has had.
# Locks its first row, so that two joins at once number their workers one after the other.
CRAWL_TO_JOIN = text("""
    SELECT c.id, c.spider, c.message, (SELECT count(*) FROM spider_job AS w WHERE w.crawl = c.id) AS workers
    FROM spider_job AS c
    WHERE c.job = :job AND c.project = :project AND c.crawl = c.id
    ORDER BY c.id DESC
    LIMIT 1
    FOR UPDATE OF c
""")

# The crawl of a running job that uses the frontier: its own when it is no worker of another (a project that names
# the frontier scheduler in its settings makes each of its crawls a crawl of one worker). None: not running.
CRAWL_OF_RUNNING_JOB = text("""
    UPDATE spider_job SET crawl = coalesce(crawl, id) WHERE id = :row_id AND status = 'ongoing' RETURNING crawl
""")

# --- operations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRequest:
    fingerprint: bytes | None  # None: dont_filter
    priority: int
    slot: str
    request: bytes


@dataclass(frozen=True)
class LeasedRequest:
    id: int
    priority: int
    request: bytes


@dataclass(frozen=True)
class Step:
    """What a worker's step did: requests stored (the rest of its new ones were duplicates), marked done and failed
    (its own leases only), the requests it leased in order, and whether the crawl still has work."""

    stored: int
    duplicates: int
    finished: int
    failed: int
    leased: list[LeasedRequest]
    crawl_open: bool


@dataclass(frozen=True)
class Worker:
    job: str
    status: str
    outcome: str | None
    node: str | None
    duplicates: int  # requests its Scrapy found already in the frontier


@dataclass(frozen=True)
class CrawlView:
    crawl: str  # the first worker's job id
    requests: dict[str, int]  # by status: ready, leased, done, failed
    done_last_minute: int
    workers: list[Worker]
    stats: dict[str, int | float]  # the sum of the workers' numeric stats


@dataclass(frozen=True)
class OpenCrawl:
    """A crawl with a worker not yet ended."""

    crawl: str  # the first worker's job id
    project: str
    spider: str
    running: int  # workers running now
    workers: int  # workers in all, ended ones included
    queued: int  # ready requests, counted up to QUEUED_COUNT_CAP
    in_flight: int  # requests held by its workers


class FrontierStore(StorePerEngine):
    """The requests of crawls spread over workers, over one database."""

    @database_errors
    def step(self, crawl: int, worker: int, new: Sequence[NewRequest] = (), done: Sequence[int] = (),
             failed: Sequence[tuple[int, str]] = (), lease: int = 0, per_slot: int = 8, delay: float = 0.0) -> Step:
        """One worker's step, all or none: store its new requests, then mark the requests whose output they are
        done (or failed), then lease up to ``lease`` more, at most ``per_slot`` held per download slot in the whole
        crawl, and with a ``delay`` (seconds) one per slot at most every ``delay``. A worker that dies between steps
        loses nothing: what it leased goes back, what it stored stays."""
        scope = {"crawl": crawl, "worker": worker}
        with db.transaction(self.engine) as connection:
            stored = 0
            if new:
                stored = connection.execute(STORE_REQUESTS, {
                    **scope, "fingerprints": [r.fingerprint for r in new], "priorities": [r.priority for r in new],
                    "slots": [r.slot for r in new], "requests": [r.request for r in new]}).rowcount
            finished = failures = 0
            if done:
                finished = connection.execute(FINISH_REQUESTS, {**scope, "ids": list(done)}).rowcount
            if failed:
                failures = connection.execute(FAIL_REQUESTS, {**scope, "ids": [i for i, _ in failed],
                                                              "errors": [error for _, error in failed]}).rowcount
            leased = []
            if lease > 0:
                connection.execute(LOCK_CRAWL_LEASES, scope)
                rows = connection.execute(LEASE_REQUESTS, {**scope, "limit": lease, "per_slot": per_slot,
                                                           "delay": delay, "scan": LEASE_SCAN}).fetchall()
                leased = sorted((LeasedRequest(row.id, row.priority, bytes(row.request)) for row in rows),
                                key=lambda r: (-r.priority, r.id))
            crawl_open = bool(leased) or connection.execute(CRAWL_OPEN, scope).scalar()
        return Step(stored, len(new) - stored, finished, failures, leased, crawl_open)

    @database_errors
    def crawl_of(self, row_id: int) -> int | None:
        """The crawl the running job ``row_id`` works for (its own, from now on, when it was no worker of one)."""
        with db.autocommit(self.engine) as connection:
            return connection.execute(CRAWL_OF_RUNNING_JOB, {"row_id": row_id}).scalar()

    @database_errors
    def counts(self, crawl: int) -> dict[str, int]:
        """The crawl's requests by status: ready, leased, done, failed (each present, 0 when none)."""
        with db.autocommit(self.engine) as connection:
            row = connection.execute(COUNT_REQUESTS, {"crawl": crawl}).one()
        return {"ready": row.ready, "leased": row.leased, "done": row.done, "failed": row.failed}

    @database_errors
    def crawl(self, project: str, job: str) -> CrawlView | None:
        """The crawl whose first worker is job ``job`` of ``project``; None when there is none."""
        with db.autocommit(self.engine) as connection:
            crawl = connection.execute(FIND_CRAWL, {"project": project, "job": job}).scalar()
            if crawl is None:
                return None
            requests = connection.execute(COUNT_REQUESTS, {"crawl": crawl}).one()
            workers = [Worker(**row._asdict()) for row in connection.execute(CRAWL_WORKERS, {"crawl": crawl})]
            stats = {row.key: int(row.total) if row.total == int(row.total) else float(row.total)
                     for row in connection.execute(CRAWL_STATS, {"crawl": crawl})}
        return CrawlView(job, {"ready": requests.ready, "leased": requests.leased, "done": requests.done,
                               "failed": requests.failed}, requests.done_last_minute, workers, stats)

    @database_errors
    def open_crawls(self) -> list[OpenCrawl]:
        """The crawls with a worker not yet ended, newest first (MAX_OPEN_CRAWLS at most)."""
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(OPEN_CRAWLS, {"cap": QUEUED_COUNT_CAP, "crawls": MAX_OPEN_CRAWLS})
            return [OpenCrawl(**row._asdict()) for row in rows]
