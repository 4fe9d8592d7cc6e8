"""The code as its linter reads it: ruff, configured in pyproject.toml (pyflakes, import order, no blind except or
late import without a comment that says why), over the package, its tests, the bench and the example project; and
every statement of the package written whole, as it is sent."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = REPOSITORY / "scrapyd_pgqueue"


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPOSITORY)], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


def test_every_statement_of_the_package_is_one_string_as_written():
    """``text()`` takes a string literal, never one built by an f-string, ``.format()`` or ``+`` (the migrations
    aside: they are history, run once): what a reader sees is what Postgres gets, and can be pasted into psql."""
    built = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "text":
                if node.args and _built(node.args[0]):
                    built.append(f"{path.relative_to(REPOSITORY)}:{node.lineno}")
            elif isinstance(node, ast.Assign) and path.parent.name in ("store", "database") and _built(node.value) \
                    and any(isinstance(part, ast.Constant) and isinstance(part.value, str) for part in ast.walk(node.value)):
                if all(isinstance(target, ast.Name) and target.id.isupper() for target in node.targets):
                    built.append(f"{path.relative_to(REPOSITORY)}:{node.lineno}")  # a statement kept as a string
    assert built == []


def _built(argument: ast.expr) -> bool:
    """An f-string, a concatenation or a ``.format()`` or ``.replace()`` call (a name passed on, as the pool's execute
    does, is not)."""
    return isinstance(argument, (ast.JoinedStr, ast.BinOp)) or (
        isinstance(argument, ast.Call) and getattr(argument.func, "attr", None) in ("format", "replace"))
