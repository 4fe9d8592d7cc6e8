"""Scrapyd's web services answered for the whole cluster, from the shared tables.

Behind a load balancer a request lands on any node, so status.json, listjobs.json, daemonstatus.json and
cancel.json answer for every job wherever it runs, in Scrapyd 1.6's JSON shapes (scrapyd-client, ScrapydWeb and
python-scrapyd-api read them), adding keys only; ``logs`` serves a job's log on every node. Each replaces
Scrapyd's own through the [services] section of the node's configuration, and is a few lines over
``store.AllJobsStore``. They read the node's settings from their web root (``services/resource.py``'s ``node_root``).
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from urllib.parse import quote, urljoin

from scrapyd.exceptions import DirectoryTraversalError
from scrapyd.utils import get_file_path
from scrapyd.webservice import WsResource, param, spider_list
from scrapyd.website import File
from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import error, http, resource, server, static

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.crawl_process.crawl_node import FRONTIER_SCHEDULER
from scrapyd_pgqueue.crawl_process.job_stats import stats_summary
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.db import DatabaseError
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.job_rules.job_requests import (
    OPTION_FIELDS,
    RefusedJob,
    check_form,
    options_from_fields,
)
from scrapyd_pgqueue.node import spawning
from scrapyd_pgqueue.services.resource import DatabaseService, node_root, refuse
from scrapyd_pgqueue.services.trees import cancel_tree
from scrapyd_pgqueue.store import (
    MAX_PENDING_OFFSET,
    AllJobsStore,
    DuplicateJobError,
    JobStore,
    cancel_signal,
    local_time,
)
from scrapyd_pgqueue.store.pools import PoolStore
from scrapyd_pgqueue.web import metrics, offload
from scrapyd_pgqueue.web.log_files import is_inside, open_log
from scrapyd_pgqueue.web.stored_logs import clamp_suffix_ranges, render_stored_log

log = Logger()

# Pending jobs in one listjobs.json answer (unless listjobs_pending_limit is larger).
MAX_PENDING_LIMIT = 10_000


def listjobs_log_url(job) -> str:
    """A job's log under every node's ``/logs/``, unquoted as Scrapyd's listjobs.json gives its ``log_url``."""
    return f"/logs/{job.project}/{job.spider}/{job.job}.log"


class Status(DatabaseService):
    """The job's state wherever it runs: the newest run of that job id."""

    @param("job")
    @param("project", required=False)
    def render_GET(self, txrequest, job, project):
        self.check_project(project)
        currstate = self.store.job_status(job, project)
        # Crawl trees: the job's parent and its tree's root (itself for a root), null for an unknown job.
        parent, root = self.store.lineage(job, project) or (None, None)
        # The tags a node needs to run it ([]: any node), null for an unknown job.
        tags = PoolStore.for_engine(self.store.engine).required_tags(job, project)
        return {"currstate": currstate, "parent": parent, "root": root, "tags": tags}


class ListJobs(DatabaseService):
    """Pending (one page in claim order), running on every node, and finished jobs of the cluster.

    ``pending_limit`` (default ``listjobs_pending_limit``) and ``pending_offset`` page the pending jobs;
    ``pending_next_offset`` is the offset of the next page, null on the last one. A page holds at most
    MAX_PENDING_LIMIT jobs (or ``listjobs_pending_limit``, when larger).
    """

    @param("project", required=False)
    @param("pending_limit", dest="limit", required=False, default=None, type=int)
    @param("pending_offset", dest="offset", required=False, default=0, type=int)
    def render_GET(self, txrequest, project, limit, offset):
        self.check_project(project)
        limit = self.settings.listjobs_pending_limit if limit is None else limit
        if limit < 0 or offset < 0:
            raise error.Error(code=http.OK, message=b"pending_limit and pending_offset may not be negative")
        max_limit = max(MAX_PENDING_LIMIT, self.settings.listjobs_pending_limit)
        if limit > max_limit:
            raise refuse(f"pending_limit may be at most {max_limit}: page with pending_offset")
        if offset > MAX_PENDING_OFFSET:
            raise refuse(f"pending_offset may be at most {MAX_PENDING_OFFSET}")
        pending, more = self.store.pending_page(project, limit, offset)
        return {
            "pending": [self.pending_entry(job) for job in pending],
            "running": [self.running_entry(job) for job in self.store.running_jobs(project)],
            "finished": [
                self.finished_entry(job)
                for job in self.store.finished_jobs(project, self.settings.finished_to_keep)
            ],
            "pending_next_offset": offset + len(pending) if more else None,
        }

    @staticmethod
    def pending_entry(job):
        message = job.message
        return {
            "id": message.get("_job", job.job),
            "project": job.project,
            "spider": message["name"],
            "version": message.get("_version"),
            "settings": message.get("settings", {}),
            "args": {k: v for k, v in message.items() if k not in ("name", "_job", "_version", "settings")},
            # A delayed job's due time (ISO 8601, UTC offset); null for a job that runs as soon as a slot frees.
            "run_at": None if job.run_at is None else job.run_at.isoformat(),
            "tags": job.tags,  # what a node needs to run it ([]: any node)
            "crawl": job.crawl,  # the crawl it is a worker of (_workers), null for a job of its own
        }

    def running_entry(self, job):
        return {
            "id": job.job,
            "project": job.project,
            "spider": job.spider,
            "pid": job.pid,
            "start_time": str(local_time(job.start_time)),
            # The log is on the node running the job; /logs/ on any other node redirects there.
            "log_url": listjobs_log_url(job) if self.root.logs_dir else None,
            "items_url": self.root.get_item_url(job),
            "node_name": job.node,
            "tags": job.tags,
            "crawl": job.crawl,
            # Its stats as its node last wrote them (every stats_interval); finish_reason comes with its end.
            **stats_summary(job.stats), "finish_reason": None,
        }

    def finished_entry(self, job):
        return {
            "id": job.job,
            "project": job.project,
            "spider": job.spider,
            "start_time": str(local_time(job.start_time)),
            "end_time": str(local_time(job.end_time)),
            "log_url": listjobs_log_url(job) if job.has_log else self.root.get_log_url(job),
            "items_url": self.root.get_item_url(job),
            "node_name": job.node,
            "tags": job.tags,
            "crawl": job.crawl,
            "outcome": job.outcome,
            **stats_summary(job.stats),  # items, requests, errors, finish_reason
        }


class DaemonStatus(DatabaseService):
    """This node as Scrapyd reports it (running: its own crawls), and the cluster under ``cluster``; ``crawl_boundary``
    says what separates its crawls: "separate users" (a uid per project) or "one user", and "landlock".

    Answered within a second whatever the database does (health checks and probes read it): the counts are read in
    threads of their own (``web/offload.py``) with PROBE_SECONDS to answer, pool wait included. A database that does
    not answer in time gives Scrapyd's error (``status`` is not "ok": the node cannot serve the cluster's API) with
    this node's ``running`` and ``"database": "unreachable"`` added.
    """

    def render(self, txrequest):
        from twisted.internet import reactor

        if txrequest.method not in (b"GET", b"HEAD"):
            return super().render(txrequest)
        gone = offload.watch(txrequest)
        probe = offload.in_thread(self.read_within_probe, txrequest, pool_name="probe", size=offload.PROBE_THREADS)
        probe.addTimeout(PROBE_SECONDS + PROBE_MARGIN, reactor)  # the probe threads may all be busy
        probe.addBoth(self.answer, txrequest, gone)
        return server.NOT_DONE_YET

    def read_within_probe(self, txrequest):
        with db.deadline(PROBE_SECONDS):
            return self.render_GET(txrequest)

    def render_GET(self, txrequest):
        cluster = self.store.cluster_counts(self.settings.lease_seconds, self.settings.past_due_seconds)
        return {
            "pending": cluster.pending,
            "running": len(self.root.launcher.processes),
            "finished": min(cluster.finished, self.settings.finished_to_keep),
            "unroutable": cluster.unroutable,  # pending jobs requiring tags no live node has (also in cluster)
            "cluster": dataclasses.asdict(cluster),
        }

    def answer(self, outcome, txrequest, gone) -> None:
        if isinstance(outcome, dict):
            data = {**outcome, "status": "ok"}
            # What keeps a project's crawls from the node and from other projects (node/spawning.py).
            data["crawl_boundary"] = spawning.boundary().names()
        elif outcome.check(DatabaseError, defer.TimeoutError):  # TimeoutError: the probe threads were all busy
            metrics.DATABASE_ERRORS.labels("web").inc()
            reason = f"no answer within {PROBE_SECONDS:g} s"
            reason = outcome.getErrorMessage() if outcome.check(DatabaseError) else reason
            data = {"status": "error", "message": f"the job queue is unavailable: {reason}",
                    "running": len(self.root.launcher.processes), "database": "unreachable"}
        else:
            log.failure("daemonstatus.json", outcome)
            data = {"status": "error", "message": f"{outcome.type.__name__}: {outcome.getErrorMessage()}"}
        offload.answer(offload.json_answer(self, txrequest, data), txrequest, gone)


PROBE_SECONDS = 0.5  # daemonstatus.json's wait for the database
PROBE_MARGIN = 0.2  # and for a probe thread, beyond it


class Alive(WsResource):
    """``alive.json``: the node's process serves requests (answered by the reactor itself, no database work): a
    liveness check that a database stall does not fail. ``daemonstatus.json`` is the readiness check."""

    def render_GET(self, txrequest):
        return {}


class Cancel(DatabaseService):
    """Cancel a pending job, or have the node running the job signal it (one signal per call, as in Scrapyd)."""

    @param("project")
    @param("job")
    @param("signal", required=False, default="INT")
    @param("_tree", dest="tree", required=False, default="0")
    def render_POST(self, txrequest, project, job, signal, tree):
        self.check_project(project)
        try:
            signal = cancel_signal(signal)
        except ValueError as e:
            raise error.Error(code=http.OK, message=str(e).encode(errors="replace")) from None
        if tree not in ("0", "1"):
            raise error.Error(code=http.OK, message=b"_tree must be 0 or 1")
        if tree == "1":  # the whole tree of root job (crawl trees: services/trees.py)
            return cancel_tree(self.store, project, job, signal)
        return {"prevstate": self.store.cancel_job(project, job, signal)}


class Logs(resource.Resource):
    """``/logs/``: this node's log files, and on every node the log of any job of the cluster.

    ``/logs/<project>/<spider>/<job>.log`` is served from this node's logs_dir when the file is here, else from
    the database (a finished job's log tail, see ``log_max_bytes``), else by a redirect to the node process that
    runs (or ran) the job while it is up. Directory listings show this node's files only.
    """

    isLeaf = True

    def __init__(self, root):
        super().__init__()
        self.root = node_root(root)
        self.local = LogFiles(root.logs_dir, "text/plain") if root.logs_dir else None

    @functools.cached_property
    def store(self) -> AllJobsStore:
        return AllJobsStore.for_settings(self.root.settings)

    def render(self, request):
        segments = request.postpath
        if len(segments) == 3 and segments[2].endswith(b".log") and not self.is_local(segments):
            project, spider, filename = (segment.decode(errors="replace") for segment in segments)
            gone = offload.watch(request)
            found = offload.in_thread(self.store.find_log, project, spider, filename.removesuffix(".log"))
            found.addCallback(lambda stored: self.render_job_log(request, project, spider, filename, stored))
            found.addErrback(self.unavailable, request)
            found.addCallbacks(offload.answer, offload.fail, callbackArgs=(request, gone),
                               errbackArgs=(request, gone))
            return server.NOT_DONE_YET
        if self.local is None:
            return resource.NoResource().render(request)
        child = resource.getChildForRequest(self.local, request)
        if isinstance(child, static.File) and not is_inside(child.path, self.root.logs_dir):
            return resource.NoResource("No such log.").render(request)  # a crawl's link out of logs_dir
        if isinstance(child, static.File) and child.isfile():
            clamp_suffix_ranges(request, child.getFileSize())
        return child.render(request)

    def is_local(self, segments) -> bool:
        if not self.root.logs_dir:
            return False
        names = (segment.decode(errors="replace") for segment in segments)
        try:
            return get_file_path(self.root.logs_dir, *names).isfile()
        except DirectoryTraversalError:
            return False

    def render_job_log(self, request, project, spider, filename, stored):
        if stored is not None and stored.log is not None:
            return render_stored_log(request, stored.log)
        if stored is not None and stored.node_url and stored.worker != pgconfig.WORKER_ID:
            path = "/".join(quote(segment) for segment in (project, spider, filename))
            request.redirect(urljoin(stored.node_url, f"logs/{path}").encode())
            return b""
        return resource.NoResource("No such log.").render(request)

    @staticmethod
    def unavailable(failure, request) -> bytes:
        failure.trap(DatabaseError)
        metrics.DATABASE_ERRORS.labels("web").inc()
        message = f"The job queue is unavailable: {failure.getErrorMessage()}"
        return resource.ErrorPage(http.SERVICE_UNAVAILABLE, "Unavailable", message).render(request)


class LogFiles(File):
    """Scrapyd's log files, each opened as ``log_files.open_log`` opens it: a FIFO or a link is not found.

    A crawl may make links in its log directory (to the node's own directory): a link is neither listed nor entered,
    so no listing shows a file that is not the node's logs."""

    def openForReading(self):
        return open_log(self.path)

    def getChild(self, path, request):
        # Every path segment below logs_dir passes here: a link at any of them is not found.
        child = super().getChild(path, request)
        if isinstance(child, static.File) and child.islink():
            return self.childNotFound
        return child

    def listNames(self):
        # Scrapyd's directoryListing lists these names, following links (isdir, getsize): leave links out.
        return [name for name in super().listNames() if not self.child(name).islink()]


class Schedule(DatabaseService):
    """schedule.json as Scrapyd's (same fields, checks and answer), refusing with a plain message what the queue
    cannot store or a crawl cannot start, and taking the scheduling fields (``_run_at``, ``_delay``, ``_unique_key``,
    ``_on_conflict``, ``_retries``, ``_retry_delay``, ``_max_runtime``, ``_stall_timeout``, ...), none of which
    reaches the spider.

    Scrapyd's own accepts a 1 MB argument, a NUL byte or a duplicate job id, and the job then fails when it is
    started, or the request ends in an exception's class name. The answer is the job's id: for a unique key held by
    a waiting job, that job's, with ``"existing": true``.
    """

    def render_POST(self, txrequest):
        try:
            check_form(txrequest.args)
            fields = {name.decode(): values[0].decode() for name, values in txrequest.args.items()}
            options = options_from_fields(fields, self.settings.default_retries)
            for name in OPTION_FIELDS:
                txrequest.args.pop(name.encode(), None)
            return self.schedule(txrequest, options)
        except (RefusedJob, DuplicateJobError, InvalidJobError) as e:
            raise refuse(str(e)) from e

    @param("project")
    @param("spider")
    @param("_version", dest="version", required=False, default=None)
    @param("jobid", required=False, default=lambda: uuid.uuid1().hex)
    @param("priority", required=False, default=0, type=float)
    @param("setting", required=False, default=list, multiple=True)
    def schedule(self, txrequest, options, project, spider, version, jobid, priority, setting):
        """Scrapyd 1.6's Schedule.render_POST, enqueuing with the options and answering where the job went."""
        self.check_project(project)
        if version and self.root.eggstorage.get(project, version) == (None, None):
            raise error.Error(code=http.OK, message=b"version '%b' not found" % version.encode())
        if spider not in spider_list.get(project, version, runner=self.root.runner):
            raise error.Error(code=http.OK, message=b"spider '%b' not found" % spider.encode())
        message = {key.decode(): values[0].decode() for key, values in txrequest.args.items()}
        if version is not None:
            message["_version"] = version
        message.update(name=spider, settings=dict(s.split("=", 1) for s in setting), _job=jobid)
        if options.join is not None:
            jobs = JobStore.for_settings(self.settings).join_crawl(
                project, options.join, spider, options.workers or 1, priority, options, self.settings.max_workers)
            return {"jobid": jobs[0].job, "workers": [job.job for job in jobs], "crawl": options.join}
        if options.workers is not None:
            return self.schedule_crawl(project, message, priority, options)
        enqueued = JobStore.for_settings(self.settings).enqueue(project, message, priority, options)
        return {"jobid": enqueued.job, **({"existing": True} if enqueued.existing else {})}

    def schedule_crawl(self, project: str, message: dict, priority: float, options) -> dict:
        """A crawl of ``_workers`` jobs sharing one frontier: answered as the first job's (the crawl's id), with
        every worker's."""
        if options.workers > self.settings.max_workers:
            raise RefusedJob(f"_workers must be at most {self.settings.max_workers} (max_workers), not "
                             f"{options.workers}")
        message["settings"] = {**message["settings"], "SCHEDULER": FRONTIER_SCHEDULER}
        jobs = JobStore.for_settings(self.settings).enqueue_crawl(project, message, priority, options, options.workers)
        return {"jobid": jobs[0].job, "workers": [job.job for job in jobs],
                **({"existing": True} if jobs[0].existing else {})}
