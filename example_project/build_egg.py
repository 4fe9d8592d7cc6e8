"""Build the example project into a Scrapyd egg.

    python example_project/build_egg.py OUTDIR

Like scrapyd-deploy, this runs ``setup.py bdist_egg``, but in a temporary copy
of the project so no build/, dist/ or *.egg-info is left in the source tree.
"""

import pathlib
import shutil
import subprocess
import sys
import tempfile

PROJECT_DIR = pathlib.Path(__file__).resolve().parent


def build_egg(output_dir) -> pathlib.Path:
    """Build the egg into ``output_dir`` (created if needed); return its path."""
    output_dir = pathlib.Path(output_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="example-egg-") as tmp:
        src = pathlib.Path(tmp, "src")
        dist = pathlib.Path(tmp, "dist")
        shutil.copytree(
            PROJECT_DIR,
            src,
            ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc", "*.egg"),
        )
        # setuptools is chatty (deprecation warnings) even with -q: keep its
        # output and show it only if the build fails.
        result = subprocess.run(
            [sys.executable, "setup.py", "-q", "bdist_egg", "-d", str(dist)],
            cwd=src,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if result.returncode:
            raise RuntimeError(f"bdist_egg failed ({result.returncode}):\n{result.stdout}")
        (egg,) = dist.glob("*.egg")
        target = output_dir / egg.name
        shutil.move(str(egg), target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTDIR")
    print(build_egg(sys.argv[1]))
