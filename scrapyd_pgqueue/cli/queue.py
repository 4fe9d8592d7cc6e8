"""The operator's subcommands of ``scrapyd-pgqueue``: the queue at a glance, and requeue, cancel, enqueue, prune.

They talk to the database directly (``store.AllJobsStore``), so they work with every node down. Tables for people
by default; ``--json`` for scripts.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import re
import sys

from scrapyd_pgqueue.cli.output import all_jobs_store, fail, print_json, resolve_project, subcommand, table, when

# How long a stopped node stays in ``status``: long enough to see a node that just went away.
RECENTLY_STOPPED_SECONDS = 3600
TROUBLED_SHOWN = 20
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
# The counts `status` shows per project and spider.
QUEUE_COUNTS = ("delayed", "pending", "past_due", "running", "dead")
SECONDS_PER_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def add_commands(commands, database_url_argument) -> None:
    """Register the operator's subcommands on the ``scrapyd-pgqueue`` parser's subparsers."""

    command = functools.partial(subcommand, commands, database_url_argument)

    status = command("status", run_status, "show the queue at a glance: pending, running per node, failures, nodes")
    status.add_argument("--lease-seconds", type=float, default=30.0,
                        help="the nodes' lease_seconds: a node silent this long is shown 'silent' (default 30)")

    status.add_argument("--past-due-seconds", type=float, default=60.0,
                        help="a pending job waiting this long since it was due counts as past due (default 60)")

    for name, run, help_text in (
        ("requeue", run_requeue, "put a finished (failed, cancelled, lost, dead...) job back to pending"),
        ("cancel", run_cancel, "cancel a pending job, or stop a running one on whichever node runs it"),
    ):
        parser = command(name, run, help_text)
        parser.add_argument("job", metavar="JOB", nargs="?" if name == "requeue" else None,
                            help="the job id (Scrapyd's jobid)")
        parser.add_argument("--project", help="the job's project (needed only when several projects have this id)")
    requeue = commands.choices["requeue"]
    requeue.add_argument("--dead", action="store_true",
                         help="instead of one job: every dead job (out of retries), of --project and --spider if given")
    requeue.add_argument("--spider", help="with --dead: only this spider's dead jobs")
    cancel = commands.choices["cancel"]
    cancel.add_argument("--signal", default="INT", help="signal for a running crawl (default INT; again: forced)")

    enqueue = command("enqueue", run_enqueue, "add the jobs of a JSON Lines file (one job object a line) to the queue")
    enqueue.add_argument("file", metavar="FILE", type=argparse.FileType("r", encoding="utf-8"),
                         help='JSON Lines: {"spider": ..., "priority": ..., "jobid": ..., "args": {...}, '
                              '"settings": {...}, "version": ...} a line; - for standard input')
    enqueue.add_argument("--project", required=True, help="the project of every job")
    enqueue.add_argument("--batch-size", type=batch_size, default=20000,
                         help=f"jobs a batch (a COPY), 1 to {MAX_BATCH_SIZE:,} (default 20,000)")
    enqueue.add_argument("--tags", metavar="TAG,TAG",
                         help="the _tags of every job without its own \"tags\" (default: each spider's route)")

    prune = command("prune", run_prune, "delete finished jobs (and their stored logs)")
    prune.add_argument("--keep", type=int, help="keep only the newest N finished jobs")
    prune.add_argument("--older-than", type=duration, metavar="AGE",
                       help="delete finished jobs that ended more than AGE ago: 90s, 30m, 12h, 7d, 2w")


# A batch's jobs are checked while its COPY runs, and one statement has the time of one operation
# (database_timeout): a batch stays well inside it on a loaded machine.
MAX_BATCH_SIZE = 100_000


def batch_size(text: str) -> int:
    """--batch-size: a whole number of jobs from 1 to MAX_BATCH_SIZE."""
    try:
        size = int(text)
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"not a number of jobs from 1 to {MAX_BATCH_SIZE:,}: {text!r}")
    return size


def duration(text: str) -> datetime.timedelta:
    match = DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 90s, 30m, 12h, 7d, 2w)")
    return datetime.timedelta(seconds=float(match[1]) * SECONDS_PER_UNIT[match[2]])


# --- status ------------------------------------------------------------------------------------------------------


def autovacuum_warning(tables: list[str]) -> str:
    return (f"autovacuum is off for {', '.join(tables)}: the nodes rewrite and delete their rows all the time, and "
            "vacuum them only where their role owns them (vacuum_interval); otherwise they grow without bound. Turn "
            "autovacuum on, or VACUUM them on a schedule.")


def run_status(args) -> int:
    from scrapyd_pgqueue.database import db

    status = read_status(args)
    if args.json:
        print_json(status)
        return 0
    print(f"Queue in {db.describe(args.database_url)}")
    for warning in status["warnings"]:
        print(f"\nWarning: {warning}")
    print_waiting(status)
    print_running(status)
    print_ended(status)
    return 0


def read_status(args) -> dict:
    """The queue at a glance, as ``status --json`` prints it."""
    from scrapyd_pgqueue.store import PENDING_COUNT_CAP
    from scrapyd_pgqueue.store.listen_slots import ListenSlotHolders
    from scrapyd_pgqueue.store.maintenance import tables_without_autovacuum
    from scrapyd_pgqueue.store.pools import PoolStore

    store = all_jobs_store(args)
    pending = store.pending_by_spider()
    queue = store.counts_by_spider(args.past_due_seconds)
    running = store.running_jobs()
    outcomes = store.outcome_counts()
    tables = tables_without_autovacuum(store.engine)
    return {
        "pending": {"total": sum(group["pending"] for group in pending), "by_spider": pending},
        "queue": {"totals": {key: sum(group[key] for group in queue) for key in QUEUE_COUNTS}, "by_spider": queue},
        "running": {"total": len(running), "jobs": running},
        "nodes": store.nodes(lease_seconds=args.lease_seconds, recent_seconds=RECENTLY_STOPPED_SECONDS),
        "finished": {"total": sum(outcomes.values()), "by_outcome": outcomes},
        "troubled": store.troubled_jobs(TROUBLED_SHOWN),
        "recovered": store.recovered_jobs(TROUBLED_SHOWN),
        "unroutable": PoolStore.for_engine(store.engine).unroutable(args.lease_seconds, PENDING_COUNT_CAP),
        "listening": [{"slot": holder.slot, "node": holder.node}
                      for holder in ListenSlotHolders.for_engine(store.engine).holders()],
        "warnings": [autovacuum_warning(tables)] if tables else [],
    }


def print_waiting(status: dict) -> None:
    pending, totals, queue = status["pending"]["by_spider"], status["queue"]["totals"], status["queue"]["by_spider"]
    print(f"\nPending: {status['pending']['total']}")
    if pending:
        print(table(["PROJECT", "SPIDER", "PENDING", "OLDEST"],
                    [(g["project"], g["spider"], g["pending"], when(g["oldest"])) for g in pending]))
    if any(totals[key] for key in ("delayed", "past_due", "dead")):
        counted = ", ".join(f"{key.replace('_', ' ')} {totals[key]}" for key in QUEUE_COUNTS)
        print(f"\nBy spider: {counted}")
        print(table(["PROJECT", "SPIDER", *(key.upper().replace("_", " ") for key in QUEUE_COUNTS)],
                    [(g["project"], g["spider"], *(g[key] for key in QUEUE_COUNTS)) for g in queue]))
    if unroutable := status["unroutable"]:
        print(f"\nUnroutable (pending, requiring tags no live node has): {sum(pool.jobs for pool in unroutable)}")
        print(table(["TAGS", "PENDING"], [(",".join(pool.tags), pool.jobs) for pool in unroutable]))


def print_running(status: dict) -> None:
    running, nodes, listening = status["running"]["jobs"], status["nodes"], status["listening"]
    print(f"\nRunning: {len(running)}")
    if running:
        print(table(["NODE", "PROJECT", "SPIDER", "JOB", "PID", "STARTED"],
                    [(j.node, j.project, j.spider, j.job, j.pid, when(j.start_time)) for j in running]))
    print(f"\nNodes: {sum(node.state == 'live' for node in nodes)} live")
    if nodes:
        print(table(["NODE", "STATE", "RUNNING", "MAX_PROC", "LAST HEARTBEAT", "URL", "TAGS"],
                    [(n.name, n.state, n.running, n.max_proc, f"{n.heartbeat_age:.1f}s ago", n.url, ",".join(n.tags))
                     for n in nodes]))
    holders = ", ".join(f"{holder['node'] or '?'} (slot {holder['slot']})" for holder in listening)
    print(f"\nListening (listen slots held; the other nodes poll): {len(listening)}{': ' if holders else ''}{holders}")


def print_ended(status: dict) -> None:
    outcomes, troubled, recovered = status["finished"]["by_outcome"], status["troubled"], status["recovered"]
    by_outcome = ", ".join(f"{outcome} {count}" for outcome, count in outcomes.items())
    print(f"\nFinished (kept): {status['finished']['total']}{f' ({by_outcome})' if by_outcome else ''}")
    if troubled:
        print(f"\nFailed, lost, interrupted, dead, timed out or stalled (newest {TROUBLED_SHOWN}):")
        print(table(["PROJECT", "SPIDER", "JOB", "OUTCOME", "NODE", "ATTEMPTS", "ENDED", "REASON"],
                    [(j.project, j.spider, j.job, j.outcome, j.node, j.attempts, when(j.end_time), j.reason)
                     for j in troubled]))
    if recovered:
        print(f"\nRecovered from a node that went away (claimed more than once; newest {TROUBLED_SHOWN}):")
        print(table(["PROJECT", "SPIDER", "JOB", "STATUS", "NODE", "ATTEMPTS"],
                    [(j.project, j.spider, j.job, j.status, j.node, j.attempts) for j in recovered]))


# --- requeue, cancel, prune --------------------------------------------------------------------------------------


def run_requeue(args) -> int:
    from scrapyd_pgqueue.store import DuplicateJobError, JobNotFoundError

    if args.dead == (args.job is not None):
        return fail("give a JOB, or --dead for every dead job")
    if args.dead:
        return _requeue_dead(args)
    if args.spider:
        return fail("--spider goes with --dead")
    store = all_jobs_store(args)
    project = resolve_project(store, args)
    if project is None:
        return 1
    try:
        store.requeue(project, args.job)
    except (JobNotFoundError, DuplicateJobError) as e:
        return fail(str(e))
    if args.json:
        print_json({"project": project, "job": args.job, "status": "pending"})
    else:
        print(f"Job {args.job} of project {project} is pending again.")
    return 0


def _requeue_dead(args) -> int:
    requeued = all_jobs_store(args).requeue_dead(args.project, args.spider)
    if args.json:
        print_json({"requeued": [{"project": project, "job": job} for project, job in requeued]})
    else:
        print(f"{len(requeued)} dead job{'s' if len(requeued) != 1 else ''} pending again.")
        for project, job in requeued:
            print(f"  {project} {job}")
    return 0


def run_cancel(args) -> int:
    from scrapyd_pgqueue.store import cancel_signal

    try:
        signal = cancel_signal(args.signal)
    except ValueError as e:
        return fail(f"--{e}")
    store = all_jobs_store(args)
    project = resolve_project(store, args)
    if project is None:
        return 1
    prevstate = store.cancel_job(project, args.job, signal)
    if args.json:
        print_json({"project": project, "job": args.job, "prevstate": prevstate})
    elif prevstate == "pending":
        print(f"Job {args.job} of project {project} was pending: cancelled, it will not run.")
    elif prevstate == "running":
        print(f"Job {args.job} of project {project} is running: its node is signalling it ({signal}).")
    else:
        print(f"Job {args.job} of project {project} is neither pending nor running: nothing to cancel.")
    return 0 if prevstate else 1


def run_prune(args) -> int:
    if args.keep is None and args.older_than is None:
        return fail("prune needs --keep N, --older-than AGE, or both")
    if args.keep is not None and args.keep < 0:
        return fail("--keep may not be negative")
    store = all_jobs_store(args)
    deleted = 0
    if args.older_than is not None:
        deleted += store.prune_finished_older_than(args.older_than)
    if args.keep is not None:
        from scrapyd_pgqueue.store import JobStore

        deleted += JobStore.for_url(args.database_url).prune_terminated(args.keep)
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"Deleted {deleted} finished job{'s' if deleted != 1 else ''}.")
    return 0


# --- enqueue -----------------------------------------------------------------------------------------------------


def run_enqueue(args) -> int:
    """Stream the file into the queue in file order, ``--batch-size`` jobs a COPY, all in one transaction: all or none.

    A batch's lines are read first, then checked one by one as the database takes them (``JobStore.enqueue_batches``):
    the database stores one part of the batch while the next is checked, and the command holds one batch whatever
    the file's size. A bad line stops the command, saying which line and why, and nothing is queued. Spider names are
    not checked against the project (no node is asked): schedule through a node's schedule_batch.json for that.
    """
    import time

    from tqdm import tqdm

    from scrapyd_pgqueue.database import waits
    from scrapyd_pgqueue.job_rules.checks import InvalidJobError
    from scrapyd_pgqueue.job_rules.job_requests import RefusedJob
    from scrapyd_pgqueue.store import DuplicateJobError, JobStore

    waits.wait_without_deadlines()  # COPY; the only database thread is this one
    store = JobStore.for_url(args.database_url)
    started = time.monotonic()
    progress = tqdm(unit=" jobs", desc="enqueued", file=sys.stderr, disable=None, mininterval=0.5)
    batches = _LineBatches(args.file, args.batch_size, args.tags)
    try:
        queued = store.enqueue_batches(args.project, batches, progress.update)
    except (RefusedJob, DuplicateJobError, InvalidJobError) as e:
        progress.close()
        return fail(f"{_on_its_line(e, batches.current)}; nothing was queued")
    progress.close()
    seconds = time.monotonic() - started
    result = {"project": args.project, "queued": queued, "seconds": round(seconds, 3)}
    if args.json:
        print_json(result)
    else:
        print(f"{queued} jobs queued in project '{args.project}' in {seconds:.1f} s ({queued / max(seconds, 1e-9):.0f}/s)")
    return 0


class _LineBatches:
    """The file's non-blank lines in batches of ``size`` (``current``: the batch being stored, as (line number,
    text)); each batch a collection of its jobs, checked as they are read: (message, priority, options), RefusedJob
    naming a bad line. ``tags``: what a job without its own requires (``--tags``). A batch's lines are all read before
    its first job is checked, so a slow input never holds a statement open."""

    def __init__(self, file, size: int, tags: str | None = None):
        self.file, self.size, self.tags = file, size, tags
        self.current: list[tuple[int, str]] = []

    def __iter__(self):
        batch = []
        for number, text in enumerate(self.file, start=1):
            if text.strip():
                batch.append((number, text))
            if len(batch) >= self.size:
                self.current, batch = batch, []
                yield _CheckedLines(self.current, self.tags)
        if batch:
            self.current = batch
            yield _CheckedLines(batch, self.tags)


class _CheckedLines:
    """One batch of lines: its length known, its jobs checked as they are read (the common line by the fast path)."""

    def __init__(self, lines: list[tuple[int, str]], tags: str | None):
        self.lines, self.tags = lines, tags

    def __len__(self) -> int:
        return len(self.lines)

    def __iter__(self):
        from scrapyd_pgqueue.job_rules.common_jobs import job_from_json_text
        from scrapyd_pgqueue.job_rules.job_requests import RefusedJob

        for number, text in self.lines:
            try:
                request = job_from_json_text(text, default_tags=self.tags)
            except (ValueError, RefusedJob) as e:
                raise RefusedJob(f"line {number}: {e}") from None
            yield request.message, request.priority, request.options


def _on_its_line(error: Exception, batch: list) -> str:
    """A store's error naming a job's index in its batch ("job 3: ..."), as the line of that job."""
    index, _, reason = str(error).partition(": ")
    if not index.startswith("job ") or not batch:
        return str(error)
    return f"line {batch[int(index.split()[-1])][0]}: {reason}"
