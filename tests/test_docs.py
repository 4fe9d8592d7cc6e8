"""The documentation: the site builds with no warning; its reference lists what the code has and nothing else (the
options, commands and metrics are generated from the code, the endpoints and webhook events checked against it
both ways); every module path and file it names exists; the README fits on two screens."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scrapyd_pgqueue.config import OPTIONS, Settings
from scrapyd_pgqueue.one_line_config import SERVICES, scrapyd_defaults
from scrapyd_pgqueue.store.webhooks import EVENTS

REPOSITORY = Path(__file__).resolve().parents[1]
DOCS = REPOSITORY / "docs"
PAGES = sorted([REPOSITORY / "README.md", *(path for path in DOCS.rglob("*.md") if "_build" not in path.parts)])
# Imports each dotted path given (a module, or a module's attribute) in a fresh interpreter, as Scrapyd loads a
# configured component; prints the ones that fail.
IMPORT_EACH = """
import importlib, sys
for path in sys.argv[1:]:
    try:
        importlib.import_module(path)
    except ModuleNotFoundError as error:
        if error.name != path:
            raise
        module, _, name = path.rpartition(".")
        if not hasattr(importlib.import_module(module), name):
            print(path)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as the README says, warnings as errors and every cross-reference checked."""
    output = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", str(DOCS), str(output)],
                            cwd=REPOSITORY, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    return output


def targets(page: str, kind: str) -> list[str]:
    """The names of a page's ``(kind-NAME)=`` targets, in order."""
    return re.findall(rf"^\({kind}-([^)]+)\)=$", (DOCS / page).read_text(), re.MULTILINE)


def test_the_site_builds_with_no_warning_and_its_generated_pages_are_the_code_s(site):
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import reference
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    for name, make in reference.PAGES.items():  # the build wrote them; the tree holds the same (commit them)
        assert (DOCS / "reference" / name).read_text() == make(), f"docs/reference/{name} is stale"
    assert (site / "index.html").exists() and (site / "reference" / "options.html").exists()


def test_the_options_reference_lists_every_option_a_node_reads_and_only_those(site):
    documented = targets("reference/options.md", "option")
    assert documented == [option.name for option in OPTIONS] and len(set(documented)) == len(documented)
    built = (site / "reference" / "options.html").read_text()
    assert all(f'id="option-{name.replace("_", "-")}"' in built for name in documented)
    source = "\n".join(path.read_text() for path in (REPOSITORY / "scrapyd_pgqueue").rglob("*.py"))
    read = set(re.findall(r"""config\.get\(\s*["'](\w+)["']""", source))
    read |= set(re.findall(r"""_get\(config,\s*["'](\w+)["']""", source))
    components = {"spiderqueue", "poller", "launcher", "jobstorage", "eggstorage", "webroot", "runner"}
    assert read - components <= set(documented)  # every option the code reads is documented
    scrapyds = set(scrapyd_defaults().options("scrapyd"))
    for option in OPTIONS:  # and every documented option is read: by settings(), by a component or by Scrapyd
        assert (option.name in {field.name for field in Settings.__dataclass_fields__.values()}
                or option.name in read or (option.scrapyd and option.name in scrapyds)), option.name
    variables = set(re.findall(r"""environ\.get\(\s*["'](SCRAPYD_\w+)["']""", source))
    assert variables - {"SCRAPYD_PGQUEUE_EGG"} <= {option.variable for option in OPTIONS}


def test_the_http_reference_has_every_endpoint_of_a_node_and_no_other():
    documented = targets("reference/http-api.md", "endpoint")
    assert sorted(documented) == sorted([*SERVICES, "jobs", "dashboard", "metrics"])


def test_the_webhook_reference_has_every_event_and_no_other():
    assert sorted(targets("reference/webhook-events.md", "event")) == sorted(EVENTS)


def test_the_command_reference_has_every_command_and_subcommand():
    from scrapyd_pgqueue.cli.entry import build_parser

    def commands(parser, prefix=""):
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for name, command in action.choices.items():
                    yield prefix + name
                    yield from commands(command, f"{prefix}{name}-")

    assert targets("reference/cli.md", "cli") == list(commands(build_parser()))
    assert {"cluster", "grant", "config", "periodic-add", "webhook-add"} <= set(targets("reference/cli.md", "cli"))


def test_every_path_the_docs_show_imports():
    shown = sorted({path for page in PAGES for path in re.findall(r"scrapyd_pgqueue(?:\.\w+)+", page.read_text())})
    assert {"scrapyd_pgqueue.application", "scrapyd_pgqueue.PostgresSpiderQueue"} <= set(shown)
    result = subprocess.run([sys.executable, "-c", IMPORT_EACH, *shown], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", f"not importable: {result.stdout.split()}"


def test_every_file_the_docs_name_is_in_the_tree():
    places = [REPOSITORY, REPOSITORY / "scrapyd_pgqueue", REPOSITORY / "tests", REPOSITORY / "tests" / "scrapyd_upstream",
              REPOSITORY / "deploy" / "helm" / "scrapyd-pgqueue"]
    named = {name for page in PAGES for name in re.findall(r"`([\w./-]+\.(?:py|sql|yaml|tpl|mako|cfg))`",
                                                         page.read_text())}
    assert len(named) > 20
    assert [name for name in sorted(named) if not any((place / name).exists() for place in places)] == []


def test_the_readme_fits_on_two_screens_and_points_into_the_site():
    readme = (REPOSITORY / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "python -m sphinx -W --keep-going -n docs docs/_build/html" in readme
    assert "docs/tutorial.md" in readme


def code_blocks(page: str, kind: str) -> list[str]:
    """The commands (``$ `` lines) of each ``{code-block}`` of ``page`` marked ``:class: kind``, in order."""
    blocks = re.findall(r"```\{code-block\} console\n:class: ([\w-]+)\n\n(.*?)```", (DOCS / page).read_text(),
                        re.DOTALL)
    return ["\n".join(line[2:] for line in body.splitlines() if line.startswith("$ ")) for marked, body in blocks
            if marked == kind]


def test_the_tutorial_and_the_how_tos_examples_run_as_written(database_url, tmp_path):
    """The tutorial's cluster started as it says (on the suite's database: SCRAPYD_DATABASE_URL, as it offers); its
    commands, then the how-tos' marked to run, in order against the first node it prints (NODE), each exiting 0 and no
    answer a Scrapyd error; Ctrl-C stops it all."""
    [start] = code_blocks("tutorial.md", "runs-in-background")
    commands = code_blocks("tutorial.md", "runs")
    assert len(commands) >= 4
    commands += [command for page in sorted((DOCS / "how-to").glob("*.md"))
                 for command in code_blocks(f"how-to/{page.name}", "runs")]
    environment = {**os.environ, "SCRAPYD_DATABASE_URL": database_url, "PATH": f"{Path(sys.executable).parent}:"
                   f"{os.environ['PATH']}"}
    cluster = subprocess.Popen(["bash", "-c", f"exec {start}"], cwd=REPOSITORY,
                               env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        printed = []
        for line in cluster.stdout:
            printed.append(line)
            if line.startswith("Ctrl-C stops"):
                break
        nodes = re.findall(r"http://127\.0\.0\.1:\d+/", "".join(printed))
        assert len(nodes) >= 4, "".join(printed)  # three nodes, and the example that names the first
        for command in commands:
            result = subprocess.run(["bash", "-c", "set -eo pipefail\n" + command], cwd=tmp_path, timeout=120,
                                    env={**environment, "NODE": nodes[0]}, capture_output=True, text=True)
            assert result.returncode == 0, (command, result.stdout, result.stderr)
            assert '"status": "error"' not in result.stdout, (command, result.stdout)
    finally:
        cluster.send_signal(signal.SIGINT)  # Ctrl-C
        remaining = cluster.communicate(timeout=120)[0]
    assert cluster.returncode == 0, remaining
