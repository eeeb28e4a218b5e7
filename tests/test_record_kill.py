"""A recorder killed with SIGKILL leaves no partial golden and a rerun completes the
rest; two recorders writing into one fresh store lose nothing. Real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.check import cli_env, make_site
from helpers.cli import run, start
from helpers.record import make_project, read_plain, statuses

from opdiff_snap.goldens import GoldenStore

N = 30  # tests per half


def many_tests_suite() -> str:
    lines = ["tests:"]
    ops = ["aten::neg", "aten::relu", "aten::sigmoid", "aten::tanh", "aten::abs", "aten::exp"]
    for half in ("a", "b"):
        for i in range(N):
            lines += [f"  - id: {half}_{i:02d}", f"    op: {ops[i % len(ops)]}",
                      f"    in: [{{type: tensor, shape: [{2 + i % 5}, {3 + i % 4}], dtype: float32, init: normal}}]"]
    return "\n".join(lines) + "\n"


def golden_dirs(goldens: Path) -> list[str]:
    if not goldens.is_dir():
        return []
    return [d.name for d in goldens.iterdir() if d.is_dir() and not d.name.startswith(".")]


def start_recorder(project: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return start(project, "record", "-j", "1", "--repeats", "1", "--warmup", "0", "--format", "json", *args,
                 env=env, start_new_session=True)


def reap_session(proc: subprocess.Popen) -> None:
    """Workers leave on their own when their parent dies; make sure of it (this
    session's process group was started by this test)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_sigkill_mid_run_leaves_no_partial_golden_and_rerun_completes(tmp_path):
    """The baseline is eager torch that, after its eighth job, waits to be let go: the
    kill always lands mid-run, however fast the machine."""
    project = make_project(tmp_path, many_tests_suite(), models=False)
    goldens = project / "goldens"
    site = make_site(tmp_path / "site")
    held = json.dumps({"hold_dir": str(tmp_path / "hold"), "hold_after": 8})
    baseline = ["--baseline", "perturb_cpu_fp32", "--preset-options", held]
    proc = start_recorder(project, *baseline, env=cli_env(site))
    try:
        deadline = time.monotonic() + 120
        while len(golden_dirs(goldens)) < 8:
            assert proc.poll() is None, f"recorder ended before it was killed:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "recorder wrote no goldens in 120 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        reap_session(proc)
    assert proc.returncode == -signal.SIGKILL

    store = GoldenStore(goldens)
    present = {(i.test_id, i.seed) for i in store.index()}
    assert len(present) == 8
    assert len(golden_dirs(goldens)) == len(present)          # no half-made golden in the listing
    assert store.verify() == []
    for test_id, seed in present:
        store.read(test_id, seed)
    assert {k for k in read_plain(goldens)} == {f"{t}|{s}" for t, s in present}
    runs = list((project / "store" / "runs").glob("*.jsonl"))
    assert len(runs) == 1 and '"type": "end"' not in runs[0].read_text()   # interrupted run: no end line

    (tmp_path / "hold" / "open").touch()
    env = cli_env(site)
    proc = run(project, "record", "--format", "json", "-j", "1", "--repeats", "1", "--warmup", "0", *baseline,
               env=env, timeout=300)
    code, report = proc.returncode, json.loads(proc.stdout)
    assert code == 0, report
    got = statuses(report)
    assert {k for k, v in got.items() if v == "KEPT"} == present
    assert {k for k, v in got.items() if v == "RECORDED"} == {(f"{h}_{i:02d}", 0) for h in "ab"
                                                              for i in range(N)} - present
    assert len(store.index()) == 2 * N and store.verify() == []


@pytest.mark.slow
def test_two_concurrent_recorders_lose_nothing(tmp_path):
    project = make_project(tmp_path, many_tests_suite(), models=False)
    procs = [start_recorder(project, "--test-ids", "a_*"), start_recorder(project, "--test-ids", "b_*")]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            reap_session(p)
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    store = GoldenStore(project / "goldens")
    assert {(i.test_id, i.seed) for i in store.index()} == {(f"{h}_{i:02d}", 0) for h in "ab" for i in range(N)}
    assert store.verify() == []
    assert len(read_plain(project / "goldens")) == 2 * N
    assert len(list((project / "store" / "runs").glob("*.jsonl"))) == 2
