"""ISpiderQueue over the shared ``spider_job`` table: a few lines over the store, like Scrapyd's own."""

from scrapyd.interfaces import ISpiderQueue
from zope.interface import implementer

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.database import roles
from scrapyd_pgqueue.job_rules.job_requests import OPTION_FIELDS, options_from_fields
from scrapyd_pgqueue.one_line_config import warn_half_configuration
from scrapyd_pgqueue.store import JobStore


@implementer(ISpiderQueue)
class PostgresSpiderQueue:
    def __init__(self, config, project):
        warn_half_configuration(config)  # the explicit form runs Scrapyd's application: say what is missing
        settings = pgconfig.settings(config)
        self.store = JobStore.for_settings(settings)
        roles.warn_if_privileged(self.store.engine)  # once per process: the node's first queue, at start-up
        self.node = settings.node_name
        self.node_tags = settings.node_tags
        self.default_retries = settings.default_retries
        self.project = project

    def add(self, name, priority=0.0, **spider_args):
        """Enqueue; the scheduling fields (_run_at, _unique_key, ...) become the job's options, not arguments."""
        message = {key: value for key, value in spider_args.items() if key not in OPTION_FIELDS}
        message["name"] = name
        options = options_from_fields({key: spider_args[key] for key in OPTION_FIELDS if key in spider_args},
                                      self.default_retries)
        return self.store.enqueue(self.project, message, priority, options)

    def pop(self):
        claimed = self.store.claim_next_jobs([self.project], 1, node=self.node, worker=pgconfig.WORKER_ID,
                                             tags=self.node_tags).jobs
        return claimed[0].message if claimed else None

    def count(self):
        return self.store.count_pending(self.project)

    def list(self):
        return self.store.list_pending(self.project)

    def remove(self, func):
        return self.store.remove_pending(self.project, func)

    def clear(self):
        self.store.clear_pending(self.project)
