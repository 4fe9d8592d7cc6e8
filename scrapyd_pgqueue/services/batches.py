"""``schedule_batch.json``: many jobs of one project in one request, all or none, one NOTIFY.

A big batch in the common form (``job_rules/common_jobs.py``) is read and stored by the node's COPY helper
(``node/copy_writer.py``) once the node has checked its project and spiders: the jobs are made and checked as the
database stores the ones before them. Any other batch, and any batch the helper does not take, is read here: the
fast path for the common form, else the general path, which gives every refusal its one message; then stored by the
helper if it is big, else by the node's one statement.
"""

from __future__ import annotations

from scrapyd.webservice import spider_list

from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.job_rules.common_jobs import batch_outline, common_batch
from scrapyd_pgqueue.job_rules.job_requests import MAX_BATCH_JOBS, RefusedJob, job_from_json, parse_json
from scrapyd_pgqueue.node import copy_writer
from scrapyd_pgqueue.services.resource import DatabaseService, refuse
from scrapyd_pgqueue.store import DuplicateJobError, JobStore


class ScheduleBatch(DatabaseService):
    """``schedule_batch.json``: many jobs of one project in one request, all or none, one NOTIFY.

    POST a JSON body ``{"project": P, "jobs": [{"spider", "priority", "jobid", "args", "settings", "version"}, ...]}``;
    the answer gives the job ids in order. Each job passes schedule.json's rules; the first that does not refuses the
    whole batch, naming its index.
    """

    def render_POST(self, txrequest):
        # A form could post JSON as text/plain from any web page, with the browser's saved credentials for the node.
        content_type = (txrequest.getHeader(b"content-type") or b"").split(b";")[0].strip().lower()
        if content_type != b"application/json":
            raise refuse("the body must be sent as Content-Type: application/json")
        document = txrequest.content.read()
        try:
            enqueued = self.store_by_helper(document)
            if enqueued is None:
                enqueued = self.store_read_batch(document)
        except (RefusedJob, DuplicateJobError, InvalidJobError) as e:
            raise refuse(str(e)) from e
        answer = {"jobids": [job.job for job in enqueued]}
        if any(job.existing for job in enqueued):
            answer["existing"] = [job.existing for job in enqueued]
        return answer

    def store_by_helper(self, document: bytes):
        """The batch read and stored by the COPY helper, where its outline passes the node's checks; None where it
        did not store it (anything to refuse is left to ``store_read_batch``, which words every refusal)."""
        outline = batch_outline(document)
        if outline is None or not copy_writer.takes(len(outline.jobs)) or len(outline.jobs) > MAX_BATCH_JOBS \
                or outline.project not in self.root.poller.queues:
            return None  # a small batch, too: its spiders are checked once, with the rest, by store_read_batch
        try:
            self.check_spiders(outline.project, outline.jobs)
        except RefusedJob:
            return None
        return copy_writer.enqueue_document(outline.project, document, self.settings.default_retries)

    def store_read_batch(self, document: bytes):
        """The batch read here (the fast path, else the general one), checked, and stored."""
        common = common_batch(document, self.settings.default_retries)  # most batches, several times faster
        if common is None:
            project, jobs = self.read_batch(document)
        else:
            project, jobs = common
            if len(jobs) > MAX_BATCH_JOBS:
                raise refuse(f"{len(jobs)} jobs: a batch takes at most {MAX_BATCH_JOBS}")
            self.check_project(project)
        self.check_spiders(project, jobs)
        return copy_writer.enqueue_many(JobStore.for_settings(self.settings), project,
                                        [(job.message, job.priority, job.options) for job in jobs])

    def read_batch(self, document: bytes) -> tuple[str, list]:
        """The body's project (checked) and jobs by the general path (a job that is not in the common form),
        refused with the first thing that is wrong."""
        try:
            body = parse_json(document)
        except (ValueError, UnicodeDecodeError) as e:
            raise refuse(f"the body must be a JSON object: {e}") from None
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list) or not body["jobs"]:
            raise refuse('the body must be a JSON object {"project": ..., "jobs": [...]} with at least one job')
        project = body.get("project")
        if not isinstance(project, str):
            raise refuse("project must be a string")
        if len(body["jobs"]) > MAX_BATCH_JOBS:
            raise refuse(f"{len(body['jobs'])} jobs: a batch takes at most {MAX_BATCH_JOBS}")
        self.check_project(project)
        jobs = []
        for index, job in enumerate(body["jobs"]):
            try:
                jobs.append(job_from_json(job, self.settings.default_retries))
            except RefusedJob as e:
                raise refuse(f"job {index}: {e}") from e
        return project, jobs

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
