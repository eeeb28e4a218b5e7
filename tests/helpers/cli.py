"""The CLI as the tests run it: through click's runner in this process (no interpreter
start-up), or in a fresh interpreter where only a real process shows what is tested
(signals, resource limits, the environment, what gets imported)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import REPO

PY = sys.executable
# `python cli.py`: this checkout's CLI whatever the path holds (the script's folder comes first)
SCRIPT = (PY, str(REPO / "cli.py"))
# `python -m opdiff_snap.cli`: the package that PYTHONPATH (or the installation) gives
MODULE = (PY, "-m", "opdiff_snap.cli")


def invoke(cwd: Path, *args: str) -> tuple[int, str, str]:
    """`opdiff ARGS` in `cwd` through click's runner: (exit code, stdout, stderr)."""
    from click.testing import CliRunner

    from opdiff_snap.cli import main

    with contextlib.chdir(cwd):
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def run(cwd: Path, *args: str, entry: Sequence[str] = SCRIPT, env: Mapping[str, str] | None = None,
        **options) -> subprocess.CompletedProcess:
    """`opdiff ARGS` in `cwd` in a fresh interpreter started as `entry`, its output captured as
    text. `env`: its whole environment (None: this process's); `options` (timeout, ...) go to
    subprocess.run."""
    return subprocess.run([*entry, *args], cwd=cwd, env=env, capture_output=True, text=True, **options)


def start(cwd: Path, *args: str, entry: Sequence[str] = SCRIPT, env: Mapping[str, str] | None = None,
          **options) -> subprocess.Popen:
    """The same left running, stdout and stderr piped as text; `options` go to subprocess.Popen."""
    return subprocess.Popen([*entry, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **options)
