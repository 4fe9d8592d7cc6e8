"""A node's big batches (``schedule_batch.json``, the crawl API) stored by COPY, in a helper process of its own.

A node cannot COPY: psycopg2 refuses COPY while a wait callback is set, and the node's (``database/waits.py``) gives
every thread its deadline, process-wide. So a batch of COPY_MIN_JOBS jobs or more goes to a helper process, started
by the first one: this package in the node's interpreter, without the callback. It stores the batch as the
``enqueue`` command does (``JobStore.enqueue_by_copy``: each job checked while the database stores the ones before
it), about twice as fast as the node's one statement, and answers where each job went. The node still reads and
checks the request; the helper gets the jobs and the database URL over its pipe (pickle: both ends are this package,
run by the same user), never on its command line, and an environment without the cluster's secrets, as a crawl's.

Its connection, the node's role's, is one of the node's: it opens it for a batch, in a slot of the node's pool kept
closed meanwhile, and closes it after, so a node holds no more connections than its pool's and its lease's. The
node's deadline holds: a helper that has not answered within the operation's time is killed, which closes its
connection and rolls its transaction back, and the request gets the store's error. One batch at a time: a batch
that comes while the helper is busy, or when it cannot start, is stored by the node's own statement. The helper
leaves when its pipe closes (the node ended) or after IDLE_SECONDS without a batch (its memory given back).
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from scrapyd_pgqueue.database import clock, db, waits
from scrapyd_pgqueue.database.db import DatabaseError, Engine, describe
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.node.crawl_keys import crawl_environment
from scrapyd_pgqueue.node.spawner import ISOLATED
from scrapyd_pgqueue.store import DuplicateJobError, Enqueued

# Jobs from which a batch is worth the helper (its connection, transaction and pipe cost about 9 ms a batch): through
# one node, batches of 100, 300, 1,000 and 3,000 jobs took 11, 16, 28 and 57 ms by the helper, 5, 12, 31 and 90 ms by
# the node's one statement.
COPY_MIN_JOBS = 1000
# Seconds without a batch before the helper leaves, giving back its connection and memory (the next batch starts it
# again, a quarter of a second).
IDLE_SECONDS = 30.0
# The helper's exit status when it left idle, before reading anything more: a batch sent meanwhile was not stored.
LEFT_IDLE = 75
# Errors the helper answers with, by name, as the store raises them.
STORE_ERRORS = {error.__name__: error for error in (InvalidJobError, DuplicateJobError, DatabaseError)}
FRAME_LENGTH = struct.Struct("!Q")  # a frame's length, before its pickle


_node_writer: CopyWriter | None = None


def install(settings, secrets) -> None:
    """This node's writer (at its start): its helper gets the node's store settings and a crawl's environment."""
    global _node_writer
    config = {"database_url": settings.database_url, "database_timeout": settings.database_timeout,
              "tree_max_jobs": settings.tree_max_jobs,
              "application_name": db.application_name(settings.node_name, "-copy"), "idle_seconds": IDLE_SECONDS}
    _node_writer = CopyWriter(config, crawl_environment(os.environ, secrets), db.engine_for_settings(settings))


def enqueue_many(store, project: str, jobs: Sequence[tuple]) -> list[Enqueued]:
    """``store.enqueue_many(project, jobs)``, by this node's helper for a big batch (once ``install`` ran)."""
    if _node_writer is None:
        return store.enqueue_many(project, jobs)
    return _node_writer.enqueue_many(project, jobs, store.enqueue_many)


def takes(count: int) -> bool:
    """Whether this node's helper takes a batch of ``count`` jobs (once ``install`` ran)."""
    return _node_writer is not None and count >= COPY_MIN_JOBS


def enqueue_document(project: str, document: bytes, default_retries: int) -> list[Enqueued] | None:
    """The jobs of a schedule_batch.json body (one the helper ``takes``, its spiders checked) read and stored by this
    node's helper, each job made as the store takes it: where each went; None where the helper did not store them (a
    busy helper, a job not in the common form: the caller reads the batch itself)."""
    return _node_writer.enqueue_document(project, document, default_retries)


class CopyWriter:
    """The node's side: sends a batch to its helper, one at a time."""

    def __init__(self, config: dict, environment: dict[str, str], engine: Engine):
        self.config = config  # the helper's: database_url, database_timeout, tree_max_jobs, idle_seconds...
        self.environment = environment
        self.engine = engine  # the node's pool: the helper's connection takes one of its slots
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def enqueue_many(self, project: str, jobs: Sequence[tuple],
                     store_by_statement: Callable[[str, Sequence[tuple]], list[Enqueued]]) -> list[Enqueued]:
        """Store ``jobs`` ((message, priority, options), all or none) as the store's ``enqueue_many`` would; say
        where each went. The store's errors (InvalidJobError, DuplicateJobError, DatabaseError) as it raises them.
        A small batch, or one that comes while the helper is busy, is left to ``store_by_statement``."""
        answer = self._ask_if_free(("jobs", project, list(jobs))) if len(jobs) >= COPY_MIN_JOBS else None
        return store_by_statement(project, jobs) if answer is None else _enqueued(answer)

    def enqueue_document(self, project: str, document: bytes, default_retries: int) -> list[Enqueued] | None:
        """``enqueue_many`` of a batch body's jobs, read by the helper; None where it did not store them (busy, or
        a job not in the common form: ``common_jobs.CommonJobs``)."""
        answer = self._ask_if_free(("document", project, document, default_retries))
        return None if answer is None or answer[0] == "uncommon" else _enqueued(answer)

    def stop(self) -> None:
        """End the helper (its transaction, if any, rolls back)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def _ask_if_free(self, request: tuple) -> tuple | None:
        """The helper's answer to ``request``; None when it is busy with another batch or cannot start."""
        if not self._lock.acquire(blocking=False):
            return None
        # The operation's time, as the node's own statement would have it; its connection is one of the pool's.
        try:
            with db.operation(self.engine), self.engine.slot_lent_out():
                seconds = max(0.0, waits.remaining_time())
                data = pickle.dumps((*request, seconds, clock.clock_offset()), protocol=pickle.HIGHEST_PROTOCOL)
                deadline = time.monotonic() + seconds
                for _ in range(2):  # a helper that left idle as the batch came is started again, once
                    process = self._running_process()
                    if process is None:
                        return None
                    answer = self._ask(process, data, deadline)
                    if answer is not None:
                        return answer
                raise self._lost("it left as the batch came, twice")
        finally:
            self._lock.release()

    def _running_process(self) -> subprocess.Popen | None:
        if self._process is not None and self._process.poll() is None:
            return self._process
        try:
            process = subprocess.Popen([sys.executable, *ISOLATED, "-m", "scrapyd_pgqueue.node.copy_helper"],
                                       env=self.environment,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        except OSError:
            return None
        self._process = process
        # Reaped as it leaves (idle, or killed), not left a zombie until the next batch looks.
        threading.Thread(target=process.wait, name="copy helper's end", daemon=True).start()
        os.set_blocking(process.stdin.fileno(), False)
        try:
            _send(process, pickle.dumps(self.config), time.monotonic() + self.config["database_timeout"])
        except (OSError, TimeoutError):
            self.stop()
            return None
        return process

    def _ask(self, process: subprocess.Popen, request: bytes, deadline: float) -> tuple | None:
        """The helper's answer; None if it had left idle without reading the batch."""
        try:
            _send(process, request, deadline)
            return pickle.loads(_receive(process, deadline))
        except (BrokenPipeError, EOFError):
            try:
                status = process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                status = None
            if status == LEFT_IDLE:
                self._process = None
                return None
            raise self._lost(f"it ended (status {status}) before it answered") from None
        except TimeoutError:
            raise self._lost("no answer in the time allowed") from None
        except OSError as e:
            raise self._lost(f"its pipe failed: {e}") from None

    def _lost(self, why: str) -> DatabaseError:
        self.stop()
        return DatabaseError(f"database at {describe(self.config['database_url'])}: the COPY helper stopped: {why}")


def _enqueued(answer: tuple) -> list[Enqueued]:
    """The helper's answer as the store's: where each job went, or the store's error raised."""
    kind, value = answer
    if kind == "ok":
        return [Enqueued(*where) for where in zip(*value)]  # three lists: pickled 10x faster than the objects
    raise STORE_ERRORS[kind](value)


def _send(process: subprocess.Popen, data: bytes, deadline: float) -> None:
    """``data`` as one frame on the helper's stdin (non-blocking), by ``deadline`` (TimeoutError)."""
    view = memoryview(FRAME_LENGTH.pack(len(data)) + data)
    fileno = process.stdin.fileno()
    while view:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([], [fileno], [], left)[1]:
            raise TimeoutError
        try:
            view = view[os.write(fileno, view):]
        except BlockingIOError:
            continue


def _receive(process: subprocess.Popen, deadline: float) -> bytes:
    """One frame from the helper's stdout by ``deadline`` (TimeoutError; EOFError when it ended)."""
    fileno = process.stdout.fileno()
    length = FRAME_LENGTH.unpack(_read_exactly(fileno, FRAME_LENGTH.size, deadline))[0]
    return _read_exactly(fileno, length, deadline)


def _read_exactly(fileno: int, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0 or not select.select([fileno], [], [], wait)[0]:
            raise TimeoutError
        chunk = os.read(fileno, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
