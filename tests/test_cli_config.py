"""``scrapyd-pgqueue config``: a complete scrapyd.conf from the options' declarations, which the repository's
scrapyd.cfg is (the image and the local cluster install it), and which a node reads as its defaults."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from scrapyd_pgqueue.cli.config_file import render
from scrapyd_pgqueue.config import OPTIONS, settings

REPOSITORY = Path(__file__).resolve().parents[1]


def test_the_repository_s_scrapyd_cfg_is_the_command_s_output():
    printed = subprocess.run([sys.executable, "-m", "scrapyd_pgqueue.cli", "config"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    assert printed == render()
    assert (REPOSITORY / "scrapyd.cfg").read_text() == printed, "regenerate: scrapyd-pgqueue config > scrapyd.cfg"


def test_the_file_names_every_option_and_its_values_are_the_defaults():
    parser = configparser.ConfigParser()
    parser.read_string(render())
    written = dict(parser.items("scrapyd"))
    text = render()
    assert all(f"{option.name} =" in text for option in OPTIONS)  # set, or shown commented out
    from_file = settings({**written, "database_url": "postgresql://node@db/queue", "node_name": "n"})
    defaults = settings({"database_url": "postgresql://node@db/queue", "node_name": "n"})
    assert from_file == defaults
