"""``scrapyd-pgqueue config``: a complete scrapyd.conf, every option with its default and one line of help, made
from the options' declarations (``config.OPTIONS``). The repository's ``scrapyd.cfg`` is its output (the image and
the local cluster install it; tests/test_cli_config.py keeps the two equal): regenerate it with
``scrapyd-pgqueue config > scrapyd.cfg``.
"""

from __future__ import annotations

import textwrap

from scrapyd_pgqueue.config import OPTIONS, Option

PREAMBLE = """\
# A complete Scrapyd node of a scrapyd_pgqueue cluster.
#
# Scrapyd does not read a file called scrapyd.cfg: install this one where it looks, for example
# /etc/scrapyd/scrapyd.conf (the Docker image does) or ./scrapyd.conf in the node's working directory
# (the local cluster, `scrapyd-pgqueue cluster`, does). Scrapy itself must see the [settings] section below
# too (schedule.json runs `scrapy list`): the image links it as /etc/scrapy.cfg, the local cluster as
# ~/.scrapy.cfg (the node's directory is its HOME). Not as ./scrapy.cfg: Scrapyd reads the nearest scrapy.cfg
# last, so its 
"""
WIDTH = 117


def add_command(commands) -> None:
    """Register ``config`` on the ``scrapyd-pgqueue`` parser's subparsers."""
    text = "print a complete scrapyd.conf: every option with its default and what it does"
    parser = commands.add_parser("config", help=text, description=text)
    parser.set_defaults(run=lambda args: print(render(), end="") or 0)


def shipped() -> dict[str, str]:
    """Where the file's value is not the option's default: the one line itself, and a node's slots written out (0,
    Scrapyd's default, means 4 per CPU; KEDA divides the queue's work by them)."""
    # Imported here: one_line_config imports Scrapyd (and Scrapy's conf), which the command line must not pay at start.
    from scrapyd_pgqueue.one_line_config import ONE_LINE

    return {"application": ONE_LINE.partition(" = ")[2], "max_proc": "4"}


def render() -> str:
    from scrapyd_pgqueue.one_line_config import scrapyd_defaults  # as in shipped()

    lines = [PREAMBLE, "[scrapyd]"]
    groups: dict[str, list[Option]] = {}
    for declared in OPTIONS:
        groups.setdefault(declared.group, []).append(declared)
    for group, options in groups.items():
        lines += ["", f"# --- {group} ".ljust(WIDTH, "-")]
        for declared in options:
            lines += [*textwrap.wrap(_described(declared), WIDTH, initial_indent="# ", subsequent_indent="# "),
                      _line(declared, scrapyd_defaults())]
    lines += ["", "# Projects baked into the node (no egg needed): project = settings module, importable by the node.",
              "[settings]", "example = example.settings", ""]
    return "\n".join(lines)


def _described(declared: Option) -> str:
    text = declared.help
    if declared.variable:
        text += f" Environment: {declared.variable} (wins over this file)."
    return text


def _line(declared: Option, scrapyds) -> str:
    value = shipped().get(declared.name) or declared.default
    if not value and declared.scrapyd:
        value = scrapyds.get("scrapyd", declared.name, fallback="")
    return f"{declared.name} = {value}" if value else f"# {declared.name} ="
