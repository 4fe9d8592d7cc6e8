"""The node's watchdog over its crawls: too long a run, no progress, no spider, a stop that is ignored.

Every second, on the reactor thread, it looks at what the node knows of each running crawl (no database statement:
only the outcome written when the crawl ends reaches the database):

- past its ``max_runtime`` (the job's ``_max_runtime``, else the node's), a crawl is asked to stop as cancel.json
  asks (SIGINT, Scrapy's graceful stop) and ends with outcome ``timeout``;
- with no new request, response or item for ``stall_timeout`` (from ``progress_at``), the same, outcome ``stalled``;
- a crawl whose spider has not opened ``start_timeout`` after its start is SIGKILLed and its job handed back as a
  stopping node hands back its claims (the attempt counted; ``max_attempts`` used up: ``interrupted``), if it reports
  its spider's opening (the node's runner or a warm fork: a runner of the user's own reports nothing);
- a crawl asked to stop (cancel.json's first signal, the watchdog) and still alive ``cancel_timeout`` later is
  SIGKILLed, with a line in its log file and one in the node's.

A spider's own limits (CLOSESPIDER_TIMEOUT, memusage) end it from inside; this is for crawls that cannot stop
themselves. Used by ``PostgresLauncher``.
"""

from __future__ import annotations

import datetime
import time

from twisted.internet import error, task
from twisted.logger import Logger

from scrapyd_pgqueue.contracts import INodeCrawls
from scrapyd_pgqueue.crawl_process.job_stats import REPORTING_RUNNER
from scrapyd_pgqueue.crawl_process.launch import ARGS
from scrapyd_pgqueue.store.statuses import STALLED, TIMEOUT

log = Logger()

# Seconds between two looks: the watchdog's precision.
CHECK_INTERVAL = 1.0


class Watchdog:
    def __init__(self, settings, crawls: INodeCrawls, runner: str):
        """``runner``: the launcher's crawl runner (only the node's own reports a spider's opening)."""
        self.settings, self.crawls, self.runner = settings, crawls, runner
        self.loop = task.LoopingCall(self.check)

    def start(self) -> None:
        self.loop.start(CHECK_INTERVAL, now=False)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()

    def check(self) -> None:
        now = time.monotonic()
        for process in self.crawls.running():
            try:
                self.check_crawl(process, now)
            except Exception:  # noqa: BLE001 - one crawl's trouble must not stop the watch over the others
                log.failure("The watchdog could not check job {job}", job=process.job)

    def check_crawl(self, process, now: float) -> None:
        if process.started_at is None or process.transport is None:
            return  # not started yet
        if process.stop_asked_at is not None:
            if not process.killed_after_stop and now - process.stop_asked_at >= self.settings.cancel_timeout:
                self.kill_unstopped(process)
            return
        start_timeout = self.settings.start_timeout if self.reports_opening(process) else None
        if (process.spider_opened_at is None and start_timeout and now - process.started_at >= start_timeout
                and not self.crawls.stopping):  # a stopping node hands its claims back itself
            self.hand_back_unstarted(process)
            return
        max_runtime = process.limits.max_runtime or self.settings.max_runtime
        if max_runtime and now - process.started_at >= max_runtime:
            self.ask_to_stop(process, TIMEOUT, f"ran past its max_runtime of {max_runtime:g}s", now)
            return
        stall_timeout = process.limits.stall_timeout or self.settings.stall_timeout
        if stall_timeout and process.progress_at is not None and now - process.progress_at >= stall_timeout:
            self.ask_to_stop(process, STALLED, f"no new request, response or item for {stall_timeout:g}s", now)

    def ask_to_stop(self, process, outcome: str, why: str, now: float) -> None:
        """As cancel.json's first signal: SIGINT, Scrapy's graceful stop; the crawl then ends with ``outcome``."""
        log.warn("Job {job} of project {project} {why}: stopping it (SIGINT), outcome {outcome}", job=process.job,
                 project=process.project, why=why, outcome=outcome)
        process.stop_asked_at = now
        process.watchdog_outcome, process.watchdog_reason = outcome, why
        try:
            process.transport.signalProcess("INT")
        except error.ProcessExitedAlready:
            pass

    def kill_unstopped(self, process) -> None:
        process.killed_after_stop = True
        line = (f"still running {self.settings.cancel_timeout:g}s after it was asked to stop: killed (SIGKILL) by "
                f"node {self.settings.node_name}")
        log.warn("Job {job} of project {project} (pid {pid}) {line}", job=process.job, project=process.project,
                 pid=process.pid, line=line)
        try:
            process.transport.signalProcess("KILL")
        except error.ProcessExitedAlready:
            return
        append_to_crawl_log(process, f"[scrapyd_pgqueue.watchdog] CRITICAL: The crawl was {line}")

    def reports_opening(self, process) -> bool:
        """Whether the crawl tells its node when its spider opens: forked warm, or spawned by the node's runner (a
        runner of the user's own adds no stats extension: start_timeout would kill every one of its crawls)."""
        return getattr(process.transport, "forked", False) or self.runner == REPORTING_RUNNER

    def hand_back_unstarted(self, process) -> None:
        """Kill a crawl that never reached its spider; the launcher hands its job back once it has ended."""
        how = "forked warm" if getattr(process.transport, "forked", False) else "spawned cold"
        log.warn("Job {job} of project {project} (pid {pid}, {how}) did not reach its spider within start_timeout "
                 "({seconds:g}s): killed (SIGKILL), its job handed back", job=process.job, project=process.project,
                 pid=process.pid, how=how, seconds=self.settings.start_timeout)
        process.start_timed_out = True
        try:
            process.transport.signalProcess("KILL")
        except error.ProcessExitedAlready:
            pass


def crawl_log_file(process) -> str | None:
    """The crawl's log file (Scrapyd's ``-s LOG_FILE=...``, in the crawl's launch); None when logs_dir is off."""
    args = list((process.launch or {}).get(ARGS, ()))
    for flag, value in zip(args, args[1:]):
        if flag == "-s" and value.startswith("LOG_FILE="):
            return value.partition("=")[2]
    return None


def append_to_crawl_log(process, message: str) -> None:
    """One line at the end of the crawl's log, in Scrapy's format, so that its stored log says it too."""
    path = crawl_log_file(process)
    if not path:
        return
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open(path, "a", encoding="utf-8") as file:
            file.write(f"{stamp} {message}\n")
    except OSError as e:
        log.error("Could not write to the log of job {job}: {error}", job=process.job, error=e)
