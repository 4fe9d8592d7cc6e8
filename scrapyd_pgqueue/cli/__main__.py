"""``python -m scrapyd_pgqueue.cli``: the ``scrapyd-pgqueue`` command, for an isolated interpreter (``python -I``: the
image's HEALTHCHECK and the chart's probes, which root runs in the node's working directory)."""

import sys

from scrapyd_pgqueue.cli import main

if __name__ == "__main__":
    sys.exit(main())
