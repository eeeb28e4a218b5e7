"""No process outlives `opdiff`: what a job starts (a subprocess, left running or waited
on while the job hangs) and what a worker interpreter starts before its hello are ended
with the worker's process group on a timeout, at the end of a run, on Ctrl-C, and when
the parent itself is killed.

Every process a test provokes is a `sleep` with an argument no other process has; the
test then scans /proc for that argument. Real CLI, real workers, eager torch."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.cli import start
from helpers.hostile import FAST, assert_clean_failure, env, run_cli
from helpers.hostile.processes import gone_within, kill_leftovers, unique_sleep, with_argument

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="scans /proc")


SUITE = """\
tests:
  - id: spawner
    op: {type: module, path: "file:spawner.py::Spawner"}
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal}]
"""

# plan.txt next to the module, "MODE ARG": start `sleep ARG`, then hang (MODE "hang"),
# crash (MODE "crash") or return (MODE "spawn"); without it the module only doubles its
# input (as when recorded)
SPAWNER = '''\
import ctypes
import os
import subprocess
import time
from pathlib import Path

from torch import nn

HERE = Path(__file__).resolve().parent


class Spawner(nn.Module):
    def forward(self, x):
        plan = HERE / "plan.txt"
        if plan.exists():
            mode, arg = plan.read_text().split()
            (HERE / "pids").mkdir(exist_ok=True)
            (HERE / "pids" / str(os.getpid())).touch()
            subprocess.Popen(["sleep", arg])
            if mode == "hang":
                time.sleep(600)
            if mode == "crash":
                ctypes.string_at(0)
        return x * 2
'''


def worker_pids(project: Path) -> list[int]:
    folder = project / "suites" / "pids"
    return [int(p.name) for p in folder.iterdir()] if folder.is_dir() else []


def wait_for(predicate, proc: subprocess.Popen, seconds: float = 180.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, f"opdiff ended too early:\n{proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A project whose one test is a file: module that can be told to start a `sleep`."""
    project = tmp_path_factory.mktemp("spawn") / "p"
    (project / "suites").mkdir(parents=True)
    (project / "suites" / "s.yaml").write_text(SUITE)
    (project / "suites" / "spawner.py").write_text(SPAWNER)
    proc = run_cli(project, "record", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project


@pytest.fixture
def project(recorded, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(recorded, tmp_path / "p"))


def plan(project: Path, mode: str) -> str:
    arg = unique_sleep()
    (project / "suites" / "plan.txt").write_text(f"{mode} {arg}\n")
    return arg


def start_check(project: Path, *args: str) -> subprocess.Popen:
    return start(project, "check", "-b", "torch_cpu_fp32", *FAST, *args, env=env())


@pytest.mark.slow
def test_a_timed_out_job_takes_what_it_started_with_it(project):
    arg = plan(project, "hang")
    try:
        proc = run_cli(project, "check", "-b", "torch_cpu_fp32", *FAST, "--timeout-s", "2", "--format", "json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        [result] = json.loads(proc.stdout)["results"]
        assert result["status"] == "TIMEOUT", result
        assert gone_within(arg, worker_pids(project)) == ([], []), "the job's sleep or its worker outlived the run"
    finally:
        kill_leftovers(arg, worker_pids(project))


@pytest.mark.slow
def test_a_crashed_job_takes_what_it_started_with_it(project):
    arg = plan(project, "crash")
    try:
        proc = run_cli(project, "check", "-b", "torch_cpu_fp32", *FAST, "--format", "json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        [result] = json.loads(proc.stdout)["results"]
        assert result["status"] == "CRASH", result
        assert gone_within(arg, worker_pids(project)) == ([], []), "the job's sleep outlived its worker"
    finally:
        kill_leftovers(arg, worker_pids(project))


@pytest.mark.slow
def test_a_normal_run_leaves_no_worker_and_nothing_its_jobs_started(project):
    arg = plan(project, "spawn")
    try:
        proc = run_cli(project, "check", "-b", "torch_cpu_fp32", *FAST, "--format", "json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["counts"] == {"PASS": 1}
        pids = worker_pids(project)
        assert pids, "the job did not run in a worker"
        assert gone_within(arg, pids) == ([], [])
    finally:
        kill_leftovers(arg, worker_pids(project))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_opdiff_stopped_mid_job_leaves_nothing_behind(project, how):
    """Ctrl-C: the run stops (exit 130, resumable) and kills the worker's group; SIGKILL of
    opdiff itself: the worker notices its parent is gone and kills its own group."""
    arg = plan(project, "hang")
    proc = start_check(project, "--timeout-s", "300")
    try:
        wait_for(lambda: with_argument(arg), proc)
        proc.send_signal(getattr(signal, how))
        out, err = proc.communicate(timeout=60)
        if how == "SIGINT":
            assert_clean_failure(proc.returncode, out, err, 130, "opdiff: interrupted")
        else:
            assert proc.returncode == -signal.SIGKILL
        assert gone_within(arg, worker_pids(project)) == ([], [])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(arg, worker_pids(project))


def _interpreter_that_never_says_hello(path: Path, arg: str) -> Path:
    path.write_text(f"#!/bin/sh\nsleep {arg} &\nsleep 600\n")
    path.chmod(0o755)
    return path


@pytest.mark.slow
def test_ctrl_c_while_a_python_interpreter_hangs_before_its_hello(project, tmp_path):
    arg = unique_sleep()
    python = _interpreter_that_never_says_hello(tmp_path / "python", arg)
    runs = sorted((project / "store" / "runs").glob("*.jsonl"))
    proc = start_check(project, "--python", str(python))
    try:
        wait_for(lambda: with_argument(arg), proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert_clean_failure(proc.returncode, out, err, 130, "opdiff: interrupted")
        assert gone_within(arg, []) == ([], [])
        assert sorted((project / "store" / "runs").glob("*.jsonl")) == runs   # nothing was run or written
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers(arg)


@pytest.mark.slow
def test_an_interpreter_that_never_says_hello_is_stopped_with_its_children(tmp_path, monkeypatch):
    from opdiff_snap.execution import pool as pool_module
    from opdiff_snap.execution.interpreter import WorkerEnvironmentError

    arg = unique_sleep()
    python = _interpreter_that_never_says_hello(tmp_path / "python", arg)
    monkeypatch.setattr(pool_module, "STARTUP_TIMEOUT_S", 3.0)
    try:
        with pool_module.WorkerPool(jobs=1, python=python) as pool:
            with pytest.raises(WorkerEnvironmentError, match="did not start within 3 s"):
                pool.environment()
        assert gone_within(arg, []) == ([], [])
    finally:
        kill_leftovers(arg)


def test_an_interrupted_installer_is_stopped_with_what_it_started(tmp_path):
    """`upgrade` builds environments with pip or uv; Ctrl-C while one runs stops it and
    whatever it started (a build, a compiler)."""
    from opdiff_snap.execution import workerenvs

    arg = unique_sleep()

    def interrupted(line: str) -> None:
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            workerenvs._stream(["sh", "-c", f"sleep {arg} & echo 'Collecting torch'; sleep 600"], interrupted,
                               tmp_path / "install.log")
        assert gone_within(arg, []) == ([], [])
    finally:
        kill_leftovers(arg)


HUNGRY = '''\
import time
import torch


class Hungry(torch.nn.Module):
    def forward(self, x):
        held = []
        for _ in range(60):                        # up to 3.75 GiB, 64 MiB at a time
            held.append(bytearray(64 * 2**20))
            time.sleep(0.05)
        return x + len(held)
'''


def test_a_worker_past_its_memory_limit_is_stopped_with_its_own_verdict(tmp_path):
    """A test whose model grows without bound (a config of a billion layers would) is
    stopped at the worker's memory limit, a setting, long before the job's timeout or the
    machine's memory: the job's own verdict says so, and the other tests run."""
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "m.py").write_text(HUNGRY)
    (tmp_path / "suites" / "s.yaml").write_text(
        "tests:\n"
        "  - {id: hungry, op: {type: module, path: 'file:m.py::Hungry'}, in: [{type: tensor, shape: [2], "
        "dtype: float32}]}\n"
        "  - {id: fine, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32}]}\n")
    (tmp_path / "pyproject.toml").write_text('[tool.opdiff]\nworker-memory-limit = "900MB"\n')
    started = time.monotonic()
    proc = run_cli(tmp_path, "record", "--format", "json", *FAST)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = {r["id"]: r for r in json.loads(proc.stdout)["results"]}
    assert results["fine"]["status"] == "RECORDED"
    hungry = results["hungry"]
    assert hungry["status"] == "BASELINE_FAIL" and "more than its limit of 900MB (worker-memory-limit" in \
        hungry["message"], hungry
    assert time.monotonic() - started < 120
