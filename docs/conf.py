"""The documentation site: Sphinx, its pages in Markdown (MyST), the furo theme.

Build it with ``python -m sphinx -W --keep-going -n docs docs/_build/html`` (the ``docs`` extra): a warning or a
broken cross-reference fails the build. The reference pages are generated from the code at build time
(``_ext/reference.py``): the options, the command line, the HTTP services, the metrics and the webhook events.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "scrapyd_pgqueue"
author = "the scrapyd_pgqueue developers"
copyright = "2026, the scrapyd_pgqueue developers"

extensions = ["myst_parser", "reference"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = "scrapyd_pgqueue"
