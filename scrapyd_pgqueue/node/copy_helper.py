"""The helper process of ``copy_writer``: stores the node's big batches by COPY, one at a time, each in its own
transaction, until its pipe closes or it has been idle for its settings' ``idle_seconds``.

Its standard input brings frames (a length, then a pickle): first the node's store settings, then one batch a frame,
either its jobs or a schedule_batch.json body to read them from; each batch's answer goes out on its standard output.
Its standard error is the node's.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import select
import sys

from scrapyd_pgqueue.crawl_process.not_dumpable import make_not_dumpable
from scrapyd_pgqueue.database import clock, db, waits
from scrapyd_pgqueue.job_rules.common_jobs import CommonJobs, NotCommon
from scrapyd_pgqueue.node.copy_writer import FRAME_LENGTH, LEFT_IDLE, STORE_ERRORS
from scrapyd_pgqueue.store import JobStore

log = logging.getLogger("scrapyd_pgqueue.node.copy_helper")


def main() -> int:
    logging.basicConfig(format="copy helper: %(levelname)s %(message)s", level=logging.WARNING)
    # Before it reads the database URL: no crawl (the node's user too) may read or trace this process from here on;
    # one that attached before is found next, and the helper leaves without the URL.
    make_not_dumpable()
    if _traced():
        log.error("traced since before it could forbid it: leaving without reading the database URL")
        return 1
    waits.wait_without_deadlines()  # COPY needs it; its waits end by the connections' TCP settings instead
    config = _read_frame()
    if config is None:
        return 0
    settings = pickle.loads(config)
    engine = db.get_engine(settings["database_url"], pool_size=1, timeout=settings["database_timeout"],
                           migrate_schema=False, application_name=settings["application_name"], purpose="copy")
    store = JobStore.for_engine(engine, settings["tree_max_jobs"])
    while True:
        if not select.select([0], [], [], settings["idle_seconds"])[0]:
            return LEFT_IDLE  # nothing read since the last answer: a batch sent meanwhile is sent again
        request = _read_frame()
        if request is None:
            return 0  # the node ended
        # Unpickled and stored without the cyclic collector, which would walk the batch's objects again and again.
        gc.disable()
        try:
            answer = _store(store, *pickle.loads(request))
        finally:
            gc.enable()
        engine.dispose()  # its connection was one of the node's pool's for this batch only
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            _write_all(FRAME_LENGTH.pack(len(data)) + data)
        except BrokenPipeError:
            return 0  # the node gave up on it (killed next) or ended


def _store(store: JobStore, kind: str, project: str, *arguments) -> tuple:
    """One batch stored: ("ok", (ids, job ids, existing)), ("uncommon", None), or (the store's error, its message)."""
    *batch, seconds, clock_offset = arguments
    clock.adopt_clock_offset(clock_offset)
    try:
        jobs = CommonJobs(*batch) if kind == "document" else batch[0]
        with waits.deadline(seconds):
            enqueued = store.enqueue_by_copy(project, jobs)
    except NotCommon:
        return "uncommon", None
    except tuple(STORE_ERRORS.values()) as e:
        return type(e).__name__, str(e)
    return "ok", ([job.id for job in enqueued], [job.job for job in enqueued], [job.existing for job in enqueued])


def _traced() -> bool:
    """Whether a process attached to this one before ``make_not_dumpable`` (attaching is refused since)."""
    with open("/proc/self/status") as status:
        return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in status)


def _read_frame() -> bytes | None:
    header = _read_exactly(FRAME_LENGTH.size)
    return None if header is None else _read_exactly(FRAME_LENGTH.unpack(header)[0])


def _read_exactly(size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


if __name__ == "__main__":
    sys.exit(main())
