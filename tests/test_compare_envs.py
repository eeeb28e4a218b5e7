"""Latency comparisons of two environments over interleaved rounds: an A/A comparison run for
real reports no change; on written histories a planted 2x slowdown is reported with its interval."""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.cli import MODULE, run
from helpers.history.synth import Res, Run, write_run
from helpers.record import record_here

from opdiff_snap import api
from opdiff_snap.analytics import connect
from opdiff_snap.analytics.interleaved import compare_rounds
from opdiff_snap.cli import main
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError

SUITE = """\
defaults: {seeds: 1}
dims: {B: 4, N: 16}
presets:
  x: {type: tensor, shape: [B, N], dtype: float32, init: normal}
tests:
  - {id: exp, op: aten::exp.default, in: [{ref: x}]}
  - {id: tanh, op: aten::tanh.default, in: [{ref: x}]}
"""


@pytest.mark.slow
def test_a_a_comparison_for_real_reports_no_latency_change(tmp_path):
    assert record_here(tmp_path, SUITE).counts() == {"RECORDED": 2}
    proc = run(tmp_path, "compare-envs", "--python", sys.executable, "-b", "torch_cpu_fp32", "--rounds", "3",
               "--repeats", "10", "-j", "1", "--format", "json", entry=MODULE, env={**os.environ, "COLUMNS": "200"},
               timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "0 latency changes" in proc.stderr and "latency over 3 interleaved rounds" in proc.stderr
    assert len(list((tmp_path / "store" / "runs").glob("*.jsonl"))) == 1 + 6   # record, then A, B x 3


def _rounds_history(store: Path, slow: float, rounds: int = 4, seed: int = 0) -> list[tuple[str, str]]:
    """`rounds` x (run A, run B) of 20 fast ops with the measured kind of noise (a per-run load
    factor, per-result lognormal sigma 0.2); in B, op00 takes `slow` times as long."""
    rnd = random.Random(seed)
    pairs = []
    for r in range(rounds):
        ids = []
        for side in ("a", "b"):
            load = math.exp(rnd.gauss(0, 0.1))
            results = []
            for i in range(20):
                ms = 0.02 * load * math.exp(rnd.gauss(0, 0.2)) * (slow if side == "b" and i == 0 else 1.0)
                times = [ms * math.exp(rnd.gauss(0, 0.05)) for _ in range(7)]
                results.append(Res(f"op{i:02d}", "onnx_cpu_fp32", infer_ms=sorted(times)[3], infer_ms_all=times))
            run_id = f"2026010{r}T00000{'0' if side == 'a' else '1'}Z-{r:02d}{side}"
            write_run(store, Run(run_id, f"2026-01-0{r + 1}T00:00:0{'0' if side == 'a' else '1'}Z", results,
                                 env={"onnxruntime": "1.31.1" if side == "a" else "1.32.0"}))
            ids.append(run_id)
        pairs.append((ids[0], ids[1]))
    return pairs


def test_planted_2x_is_reported_and_a_a_is_not(tmp_path):
    pairs = _rounds_history(tmp_path / "planted", slow=2.0)
    with connect(tmp_path / "planted") as a:
        comp = compare_rounds(a, pairs)
    assert [(r["test_id"], r["rounds"]) for r in comp.changes.dicts()] == [("op00", 4)]
    row = comp.changes.dicts()[0]
    assert row["ci_low"] > 1.1 and row["ci_low"] < 2.0 < row["ci_high"]

    pairs = _rounds_history(tmp_path / "same", slow=1.0, seed=1)
    with connect(tmp_path / "same") as a:
        comp = compare_rounds(a, pairs)
    assert len(comp.all) == 20 and len(comp.changes) == 0


def test_the_planted_change_is_attributed_to_the_environment_change(tmp_path):
    _rounds_history(tmp_path, slow=2.0, rounds=4)
    res = api.regressions(settings=Settings(store=tmp_path))
    latency = [f for f in res if f.kind == "latency"]
    assert [(f.test_id, f.change) for f in latency] == [("op00", "onnxruntime 1.31.1 -> 1.32.0")]


def test_one_round_is_no_interval(tmp_path):
    pairs = _rounds_history(tmp_path, slow=1.0, rounds=1)
    with connect(tmp_path) as a, pytest.raises(OpdiffError, match="at least 2 rounds"):
        compare_rounds(a, pairs)
    res = CliRunner().invoke(main, ["--store", str(tmp_path), "compare-envs", "--python", sys.executable,
                                    "-b", "torch_cpu_fp32", "--rounds", "1"])
    assert res.exit_code == 2 and "--rounds of at least 2" in res.stderr and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["--store", str(tmp_path), "compare-envs", "--python", sys.executable,
                                    "-b", "torch_cpu_fp32", "--min-ratio", "0.9"])
    assert res.exit_code == 2 and "--min-ratio must be at least 1" in res.stderr


def test_an_interpreter_that_cannot_run_workers_is_refused_before_any_run(tmp_path):
    """Neither side runs unless both interpreters can run workers: no run file is written,
    and the message (exit 2) is true."""
    from opdiff_snap.execution.interpreter import WorkerEnvironmentError, probe

    assert record_here(tmp_path, SUITE).counts() == {"RECORDED": 2}
    runs = sorted((tmp_path / "store" / "runs").glob("*.jsonl"))
    echo = tmp_path / "echo.sh"
    echo.write_text("#!/bin/sh\necho hello there\n")
    echo.chmod(0o755)
    for python in ("/bin/true", "/bin/false", str(echo)):
        with contextlib.chdir(tmp_path):
            res = CliRunner().invoke(main, ["compare-envs", "--python", python, "-b", "torch_cpu_fp32",
                                            "--rounds", "2", "-j", "1"])
        assert res.exit_code == 2, res.output
        assert f"the worker under {python} " in res.stderr and "nothing was run" in res.stderr
        assert "Traceback" not in res.output
        assert sorted((tmp_path / "store" / "runs").glob("*.jsonl")) == runs, python
    hangs = tmp_path / "hangs.sh"
    hangs.write_text("#!/bin/sh\nsleep 30\n")
    hangs.chmod(0o755)
    with pytest.raises(WorkerEnvironmentError, match="did not say whether it can run opdiff-snap workers within 1 s"):
        probe(hangs, timeout_s=1)
    probe(Path(sys.executable))   # this interpreter can
