"""The code as its linter reads it: ruff, configured in pyproject.toml (pyflakes, import order, no blind except or
late import without a comment that says why), over the package, its tests, the bench and the example project."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(REPOSITORY)], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
