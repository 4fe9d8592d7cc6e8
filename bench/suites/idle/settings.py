"""The idle suite's constants: the pollers compared, the simulated nodes' configuration, the sizes."""

from __future__ import annotations

SERIES = ("pgqueue", "stock")

POLLERS = {"pgqueue": "scrapyd_pgqueue.PostgresPoller", "stock": "scrapyd.poller.QueuePoller"}
SPIDERQUEUE = "scrapyd_pgqueue.PostgresSpiderQueue"
MAX_PROC = 4  # slots per simulated node (scrapyd.cfg's max_proc)
DEFAULT_POLL_INTERVAL = 5.0  # Scrapyd's default: what the per-second figures are given at
# Off for the measure: with it on, each pgqueue node holds one LISTEN connection that sends nothing while idle, but
# the backend of that connection reports its LISTEN transaction up to 10 s late (an idle backend reports its
# statistics on a timer), into the window, which would spoil the exact transaction count.
LISTEN_NOTIFY = "off"
RANDOM_SEED = 7


class Sizes:
    def __init__(self, nodes, projects, interval, warmup_ticks, window_ticks, max_window_seconds):
        self.nodes = nodes  # K
        self.projects = projects  # P
        self.interval = interval  # seconds between ticks of one node in the simulation
        self.warmup_ticks = warmup_ticks  # ticks per node before the window
        self.window_ticks = window_ticks  # at least this many ticks per node (and interval x this many seconds)
        self.max_window_seconds = max_window_seconds


SIZES = {
    "quick": Sizes(nodes=(1, 5), projects=(1, 20), interval=0.25, warmup_ticks=1, window_ticks=4,
                   max_window_seconds=20.0),
    "full": Sizes(nodes=(1, 10, 50), projects=(1, 20, 200), interval=1.0, warmup_ticks=2, window_ticks=8,
                  max_window_seconds=90.0),
}
CHILD_TIMEOUT = 1800.0  # seconds for the whole grid in the child
