"""Fixtures for the cause tests: a small suite (suite.yaml) and its modules (models.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

SUITE = Path(__file__).resolve().parent / "suite.yaml"

# Run a script with the project not importable: isolated mode (-I: no PYTHONPATH, no
# script dir, no user site), PYTHONPATH cleared, and opdiff_snap blocked in sys.modules
# because the venv has it installed editable.
_BLOCKED_RUNNER = ("import runpy, sys; sys.modules['opdiff_snap'] = None; "
                   "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def load_case(test_id: str, seed: int = 0):
    from opdiff_snap.suite import load_suites
    from opdiff_snap.suite.materialize import materialize
    case = next(c for c in load_suites([SUITE]) if c.id == test_id)
    return case, materialize(case, seed)


def baseline_outputs(case, invocation):
    from opdiff_snap.execution.target import build_target
    with torch.no_grad():
        return build_target(case, invocation)()


def _isolated(script: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return [sys.executable, "-I", "-c", _BLOCKED_RUNNER, str(script)], env


def run_isolated(script: Path, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    argv, env = _isolated(script)
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def start_isolated(script: Path, cwd: Path) -> subprocess.Popen:
    """run_isolated without waiting: several scripts run side by side."""
    argv, env = _isolated(script)
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
