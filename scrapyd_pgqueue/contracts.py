"""What the node's parts need of each other, written down as ``zope.interface`` interfaces (as Scrapyd's own
``scrapyd/interfaces.py``): each member's docstring says who needs it and why.

- The launcher (``components/launcher.py``) needs more than Scrapyd's interfaces of the poller, the job storage and
  the egg storage: ``IClaimingPoller``, ``IRecordingJobStorage``, ``IEggFiles``. It checks once, when it is built,
  which of them the configured components provide; Scrapyd's own components provide none, and still work.
- ``node/`` (leases, events, watchdog) needs the node's crawls of the launcher, not the launcher: ``INodeCrawls``.
- The cluster's services (``services/``) and pages (``web/``) need ``INodeRoot`` of the web root they hang under.

Only ``zope.interface`` and Scrapyd's interfaces are imported: the crawl process may import this module.
"""

from __future__ import annotations

from scrapyd.interfaces import IEggStorage, IJobStorage, IPoller
from zope.interface import Attribute, Interface


class IClaimingPoller(IPoller):
    """A poller that claims jobs on the shared queue (``components/poller.py``): each message it hands out stands for
    a claim on a row, which the launcher's writes are conditional on."""

    def take_claim(message):
        """The claim (``store.ClaimedJob``) behind a message this poller handed out, None when it has none: the
        launcher records the crawl's pid, finish and hand-back on that claim, so a late writer never clobbers a newer
        attempt."""

    def claimed_ids():
        """Any thread: the row ids of the claims handed out and not taken yet: the node's tick must not hand them back
        as claims whose reply was lost."""

    def periodic_due_in(seconds):
        """Reactor thread: the tick read that the cluster's next periodic job is due in ``seconds`` (None: none is
        active): the poller's periodic firer wakes then."""

    def stop():
        """Stop claiming: a stopping node takes no new job while its crawls end."""


class IRecordingJobStorage(IJobStorage):
    """A job storage whose finish and pruning are apart (``components/jobstorage.py``): the launcher writes a batch
    of finishes, each on its own, and prunes once after it."""

    def record(job):
        """Thread: write one finished crawl (the launcher's process protocol); raises when it is not written, so the
        launcher keeps it and tries again next heartbeat."""

    def tidy():
        """Thread: prune and vacuum after a batch of finishes; never raises (the finishes are written already)."""


class IEggFiles(IEggStorage):
    """An egg storage that gives the node each egg checked and sealed (``components/eggstorage.py``): the crawl, which
    holds no database URL, imports the memory file the node hands it."""

    def sealed_egg(project, version=None):
        """Thread: the egg a job of ``project`` runs (the newest version unless pinned) as a ``SealedEgg`` (a sealed
        memory file holding the bytes checked against the egg's sha256, the caller's descriptor to close, and that
        digest); None when the project has no egg. The launcher hands it to the crawl and to its warm process, and
        ``scrapy list`` (``node/spider_list.py``) gets it too."""

    def listed_spiders(egg):
        """Thread: the spiders of a ``SealedEgg`` as a node listed them (``scrapy list``) for the whole cluster; None
        when none has yet."""

    def remember_spiders(egg, spiders):
        """Thread: the spiders ``scrapy list`` found in a ``SealedEgg``, for every node of the cluster."""

    def prune_cache():
        """Thread: forget the cached eggs the database no longer has; returns the file names deleted.
        ``node/events.py`` calls it when eggs change anywhere in the cluster."""


class INodeCrawls(Interface):
    """What ``node/`` (the lease threads, the cluster's events, the watchdog) needs of the launcher: the node's crawls
    (the launcher's process protocols) and whether the node is stopping."""

    stopping = Attribute(
        "True once the graceful stop began: the lease thread recovers nobody's jobs and the watchdog hands none back "
        "(the stop hands the node's claims back itself)."
    )

    def running():
        """Any thread: a list of the crawls running now: the lease thread writes their stats, the lease watch and the
        watchdog signal them, the events deliver cancel requests to them and keep their egg files."""

    def held():
        """Any thread: the crawls running and those ended whose finish is not written yet: after a break in its
        heartbeats the lease thread says which of them another node took over."""

    def known_claim_ids():
        """Any thread: the row ids of the jobs this node runs or is about to run: the tick hands back only the claims
        it has no crawl for."""


class INodeRoot(Interface):
    """What the cluster's services (``services/``) and pages (``web/``) need of the web root they hang under. Scrapyd's
    own root gives every member but ``settings`` (``services/resource.py`` adds it when an explicit configuration
    names no webroot)."""

    settings = Attribute("The node's settings (``config.Settings``): the database every answer reads, its limits.")

    # What the answers and pages say of this node, and link to.
    node_name = Attribute("This node's name: the pages say which node shows them, /jobs which jobs ran here.")
    logs_dir = Attribute("This node's log directory ('' for none): logs serves its files before the stored tails.")
    local_items = Attribute("Whether items are files under items_dir: /jobs links them.")
    prefix_header = Attribute("The header of a reverse proxy's path prefix: the pages' links start with it.")

    def get_log_url(job):
        """The URL of a job's log file on this node, None when it has none: listjobs.json's and /jobs' links."""

    def get_item_url(job):
        """The URL of a job's items on this node, None when it has none: listjobs.json's and /jobs' links."""

    # What a request is checked against, and what this node runs.
    runner = Attribute("The crawl runner: schedule.json and addperiodic.json check the spider with its `scrapy list`.")
    eggstorage = Attribute("The node's egg storage: schedule.json checks that a pinned version exists.")
    poller = Attribute("The node's poller: its ``queues`` are the projects this node knows (others are refused).")
    launcher = Attribute("The node's launcher: daemonstatus.json counts its ``processes``, /metrics its ``max_proc``.")
