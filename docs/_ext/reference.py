"""The reference pages made from the code when the site is built: every option (``config.OPTIONS``), every command
of ``scrapyd-pgqueue`` (its argparse parsers) and every metric of ``/metrics`` (``web.prometheus.documented_metrics``).

Each page is written to docs/reference/ before Sphinx reads the sources, and only when its text changed; the files
are in the repository too, for readers of the tree, and tests/test_docs.py fails when one differs from what this
module makes. Each entry gets a target to link to: ``option-NAME``, ``cli-COMMAND`` (``cli-periodic-add`` for a
subcommand's), ``metric-NAME``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "reference"
GENERATED = "<!-- Generated from the code by docs/_ext/reference.py when the site is built: do not edit. -->"


def options_page() -> str:
    from scrapyd_pgqueue.cli.config_file import shipped
    from scrapyd_pgqueue.config import OPTIONS
    from scrapyd_pgqueue.one_line_config import scrapyd_defaults

    lines = [GENERATED, "", "# Options", "",
             "Every option a node reads, in the `[scrapyd]` section of its scrapyd.conf; an environment variable, "
             "where there is one, wins over the file. `scrapyd-pgqueue config` prints a complete file with each "
             "default and help (the repository's `scrapyd.cfg` is its output).", ""]
    group = None
    for declared in OPTIONS:
        if declared.group != group:
            group = declared.group
            lines += [f"## {group}", ""]
        default = declared.default
        if declared.scrapyd and not default:
            default = scrapyd_defaults().get("scrapyd", declared.name, fallback="")
        facts = [f"default `{default}`" if default else "unset by default"]
        if shipped().get(declared.name, default) != default:
            facts.append(f"`{shipped()[declared.name]}` in the shipped scrapyd.cfg")
        if declared.variable:
            facts.append(f"environment `{declared.variable}`")
        if declared.scrapyd:
            facts.append("Scrapyd's own option")
        lines += [f"(option-{declared.name})=", f"### `{declared.name}`", "", declared.help, "",
                  f"*{'; '.join(facts)}*", ""]
    return "\n".join(lines)


def cli_page() -> str:
    from scrapyd_pgqueue.cli.entry import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal's width: the same page on every machine
    parser = build_parser()
    lines = [GENERATED, "", "# The `scrapyd-pgqueue` command", "", parser.description.strip(), "",
             "Commands that reach the database take its URL from `SCRAPYD_DATABASE_URL` or a file "
             "(`--database-url-file`), never from the command line.", ""]
    for name, command in _subcommands(parser):
        lines += _command(name, command, level=2)
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, command in action.choices.items():
                command.help_text = helps.get(name) or command.description or ""
                yield name, command


def _command(name: str, command: argparse.ArgumentParser, level: int) -> list[str]:
    label = command.prog.removeprefix("scrapyd-pgqueue ").replace(" ", "-")
    lines = [f"(cli-{label})=", f"{'#' * level} `{command.prog}`", "", command.help_text.strip(), "",
             "```text", command.format_usage().strip(), "```", ""]
    arguments = [action for action in command._actions
                 if action.help != argparse.SUPPRESS and not isinstance(action, (argparse._HelpAction,
                                                                                   argparse._SubParsersAction))]
    if arguments:
        lines += ["| argument | what it does |", "| --- | --- |"]
        for action in arguments:
            shown = ", ".join(f"`{string}`" for string in action.option_strings) or f"`{action.metavar or action.dest}`"
            lines.append(f"| {shown} | {(action.help or '').replace('|', '/') % vars(action)} |")
        lines.append("")
    for sub_name, sub_command in _subcommands(command):
        lines += _command(sub_name, sub_command, min(level + 1, 4))
    return lines


def metrics_page() -> str:
    from scrapyd_pgqueue.web.prometheus import documented_metrics

    lines = [GENERATED, "", "# Metrics", "",
             "What `/metrics` exports in Prometheus' text format: this node's counters and histogram, its gauges, "
             "and the cluster's gauges, the same on every node (aggregate them with `max without (instance)`). No "
             "label has a value per job.", ""]
    for name, kind, documentation, labels in documented_metrics():
        shown_labels = ", ".join(f"`{label}`" for label in labels) or "none"
        lines += [f"(metric-{name})=", f"## `{name}`", "", documentation, "",
                  f"*{kind}; labels: {shown_labels}*", ""]
    return "\n".join(lines)


PAGES = {"options.md": options_page, "cli.md": cli_page, "metrics.md": metrics_page}


def write_pages(app=None) -> list[Path]:
    """Write each generated page whose text changed; the paths written."""
    written = []
    for name, make in PAGES.items():
        path, text = REFERENCE / name, make()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def setup(app):
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True}
