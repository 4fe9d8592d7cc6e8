"""Scrapyd's web services answered for the whole cluster, from the shared tables.

Behind a load balancer a request lands on any node, so status.json, listjobs.json, daemonstatus.json and
cancel.json answer for every job wherever it runs, in Scrapyd 1.6's JSON shapes (scrapyd-client, ScrapydWeb and
python-scrapyd-api read them), adding keys only; ``logs`` serves a job's log on every node. Each replaces
Scrapyd's own through the [services] section of the node's configuration, and is a few lines over
``store.ClusterStore``. They read the node's settings from ``PostgresPoller``, which a cluster runs anyway.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from urllib.parse import quote, urljoin

from twisted.web import error, http, resource

from scrapyd.exceptions import DirectoryTraversalError
from scrapyd.utils import get_file_path
from scrapyd.webservice import WsResource, param, spider_list
from scrapyd.website import File
from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.db import DatabaseError
from scrapyd_pgqueue.job_requests import (
    MAX_BATCH_JOBS,
    OPTION_FIELDS,
    RefusedJob,
    check_form,
    job_from_json,
    options_from_fields,
)
from scrapyd_pgqueue.store import SIGNAL_NAMES, ClusterStore, DuplicateJobError, InvalidJobError, JobStore


def log_path(job) -> str:
    """The path of a job's log under every node's ``/logs/`` (Scrapyd's own log URL)."""
    return f"/logs/{job.project}/{job.spider}/{job.job}.log"


class DatabaseErrorsAsMessages(resource.Resource):
    """Answers a database that is away with a plain message in Scrapyd's JSON error, not an exception's name.

    Placed after WsResource in a service's bases: WsResource.render turns the raised error into the JSON.
    """

    def render(self, txrequest):
        try:
            return super().render(txrequest)
        except DatabaseError as e:
            raise error.Error(code=http.OK, message=f"the job queue is unavailable: {e}".encode()) from e


class ClusterResource(WsResource, DatabaseErrorsAsMessages):
    """A web service over the cluster's tables."""

    @functools.cached_property
    def settings(self) -> pgconfig.Settings:
        return self.root.poller.settings

    @functools.cached_property
    def store(self) -> ClusterStore:
        return ClusterStore.for_settings(self.settings)

    def check_project(self, project: str | None) -> None:
        if project is not None and project not in self.root.poller.queues:
            raise error.Error(code=http.OK, message=b"project '%b' not found" % project.encode())


class Status(ClusterResource):
    """The job's state wherever it runs: the newest run of that job id."""

    @param("job")
    @param("project", required=False)
    def render_GET(self, txrequest, job, project):
        self.check_project(project)
        currstate = self.store.job_status(job, project)
        # Crawl trees: the job's parent and its tree's root (itself for a root), null for an unknown job.
        parent, root = self.store.lineage(job, project) or (None, None)
        return {"currstate": currstate, "parent": parent, "root": root}


class ListJobs(ClusterResource):
    """Pending (one page in claim order), running on every node, and finished jobs of the cluster.

    ``pending_limit`` (default ``listjobs_pending_limit``) and ``pending_offset`` page the pending jobs;
    ``pending_next_offset`` is the offset of the next page, null on the last one.
    """

    @param("project", required=False)
    @param("pending_limit", dest="limit", required=False, default=None, type=int)
    @param("pending_offset", dest="offset", required=False, default=0, type=int)
    def render_GET(self, txrequest, project, limit, offset):
        self.check_project(project)
        limit = self.settings.listjobs_pending_limit if limit is None else limit
        if limit < 0 or offset < 0:
            raise error.Error(code=http.OK, message=b"pending_limit and pending_offset may not be negative")
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
        }

    def running_entry(self, job):
        return {
            "id": job.job,
            "project": job.project,
            "spider": job.spider,
            "pid": job.pid,
            "start_time": str(job.start_time),
            # The log is on the node running the job; /logs/ on any other node redirects there.
            "log_url": log_path(job) if self.root.logs_dir else None,
            "items_url": self.root.get_item_url(job),
            "node_name": job.node,
        }

    def finished_entry(self, job):
        return {
            "id": job.job,
            "project": job.project,
            "spider": job.spider,
            "start_time": str(job.start_time),
            "end_time": str(job.end_time),
            "log_url": log_path(job) if job.has_log else self.root.get_log_url(job),
            "items_url": self.root.get_item_url(job),
            "node_name": job.node,
            "outcome": job.outcome,
        }


class DaemonStatus(ClusterResource):
    """This node as Scrapyd reports it (running: its own crawls), and the cluster under ``cluster``."""

    def render_GET(self, txrequest):
        cluster = self.store.cluster_counts(self.settings.lease_seconds, self.settings.past_due_seconds)
        return {
            "pending": cluster.pending,
            "running": len(self.root.launcher.processes),
            "finished": min(cluster.finished, self.settings.finished_to_keep),
            "cluster": dataclasses.asdict(cluster),
        }


class Cancel(ClusterResource):
    """Cancel a pending job, or have the node running the job signal it (one signal per call, as in Scrapyd)."""

    @param("project")
    @param("job")
    @param("signal", required=False, default="INT")
    @param("_tree", dest="tree", required=False, default="0")
    def render_POST(self, txrequest, project, job, signal, tree):
        self.check_project(project)
        if not (signal.isdigit() or signal in SIGNAL_NAMES):
            names = ", ".join(SIGNAL_NAMES).encode()
            raise error.Error(code=http.OK, message=b"signal must be a number or one of " + names)
        if tree not in ("0", "1"):
            raise error.Error(code=http.OK, message=b"_tree must be 0 or 1")
        if tree == "1":  # the whole tree of root job (crawl trees: tree_services.cancel_tree)
            from scrapyd_pgqueue.tree_services import cancel_tree

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
        self.root = root
        self.local = File(root.logs_dir, "text/plain") if root.logs_dir else None

    @functools.cached_property
    def store(self) -> ClusterStore:
        return ClusterStore.for_settings(self.root.poller.settings)

    def render(self, request):
        segments = request.postpath
        if len(segments) == 3 and segments[2].endswith(b".log") and not self.is_local(segments):
            return self.render_job_log(request, *(segment.decode(errors="replace") for segment in segments))
        if self.local is None:
            return resource.NoResource().render(request)
        return resource.getChildForRequest(self.local, request).render(request)

    def is_local(self, segments) -> bool:
        if not self.root.logs_dir:
            return False
        names = (segment.decode(errors="replace") for segment in segments)
        try:
            return get_file_path(self.root.logs_dir, *names).isfile()
        except DirectoryTraversalError:
            return False

    def render_job_log(self, request, project, spider, filename):
        stored = self.store.find_log(project, spider, filename.removesuffix(".log"))
        if stored is not None and stored.log is not None:
            request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
            return stored.log
        if stored is not None and stored.node_url and stored.worker != pgconfig.WORKER_ID:
            path = "/".join(quote(segment) for segment in (project, spider, filename))
            request.redirect(urljoin(stored.node_url, f"logs/{path}").encode())
            return b""
        return resource.NoResource("No such log.").render(request)


class Schedule(ClusterResource):
    """schedule.json as Scrapyd's (same fields, checks and answer), refusing with a plain message what the queue
    cannot store or a crawl cannot start, and taking the scheduling fields (``_run_at``, ``_delay``, ``_unique_key``,
    ``_on_conflict``, ``_retries``, ``_retry_delay``), none of which reaches the spider.

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
            raise _refuse(str(e)) from e

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
        enqueued = JobStore.for_settings(self.settings).enqueue(project, message, priority, options)
        return {"jobid": enqueued.job, **({"existing": True} if enqueued.existing else {})}


def _refuse(message: str):
    return error.Error(code=http.OK, message=message.encode())


class ScheduleBatch(ClusterResource):
    """``schedule_batch.json``: many jobs of one project in one request, all or none, one NOTIFY.

    POST a JSON body ``{"project": P, "jobs": [{"spider", "priority", "jobid", "args", "settings", "version"}, ...]}``;
    the answer gives the job ids in order. Each job passes schedule.json's rules; the first that does not refuses the
    whole batch, naming its index.
    """

    def render_POST(self, txrequest):
        try:
            body = json.loads(txrequest.content.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise _refuse(f"the body must be a JSON object: {e}") from None
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) or not body["jobs"]:
            raise _refuse('the body must be a JSON object {"project": ..., "jobs": [...]} with at least one job')
        project = body.get("project")
        if not isinstance(project, str):
            raise _refuse("project must be a string")
        if len(body["jobs"]) > MAX_BATCH_JOBS:
            raise _refuse(f"{len(body['jobs'])} jobs: a batch takes at most {MAX_BATCH_JOBS}")
        self.check_project(project)
        try:
            jobs = []
            for index, job in enumerate(body["jobs"]):
                try:
                    jobs.append(job_from_json(job, self.settings.default_retries))
                except RefusedJob as e:
                    raise RefusedJob(f"job {index}: {e}") from None
            self.check_spiders(project, jobs)
            store = JobStore.for_settings(self.settings)
            enqueued = store.enqueue_many(project, [(job.message, job.priority, job.options) for job in jobs])
        except (RefusedJob, DuplicateJobError, InvalidJobError) as e:
            raise _refuse(str(e)) from e
        answer = {"jobids": [job.job for job in enqueued]}
        if any(job.existing for job in enqueued):
            answer["existing"] = [job.existing for job in enqueued]
        return answer

    def check_spiders(self, project, jobs) -> None:
        """As schedule.json does for one job: each version exists, each spider is in its version's list."""
        spiders = {}
        for index, job in enumerate(jobs):
            if job.version not in spiders:
                if job.version and self.root.eggstorage.get(project, job.version) == (None, None):
                    raise RefusedJob(f"job {index}: version '{job.version}' not found")
                spiders[job.version] = spider_list.get(project, job.version, runner=self.root.runner)
            if job.spider not in spiders[job.version]:
                raise RefusedJob(f"job {index}: spider '{job.spider}' not found")
