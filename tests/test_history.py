"""history/runs.py: run files (meta / item / end), resume after a kill, lookup."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from opdiff_snap.compare.numerics import compare
from opdiff_snap.compare.results import Result
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.history.runs import check_store_dir, list_runs, read_run
from opdiff_snap.history.writer import RunStart, RunWriter
from opdiff_snap.storage import open_runs
from opdiff_snap.suite.model import Tolerance

PRESETS = {"onnx_cpu_fp32": {"family": "onnx", "device": "cpu", "precision": "fp32", "options": {}}}
SETTINGS = {"jobs": 2, "repeats": 5, "warmup": 1, "timeout_s": 300, "in_process": False, "cache": True}


def start(store: Path, **kw) -> RunWriter:
    return RunWriter.start(store, RunStart("check", ["check", "--backend", "onnx_cpu_fp32"],
                                           ["suites/core.yaml"], PRESETS, SETTINGS, **kw))


def find_run(store: Path, run_id: str) -> Path:
    """The file of `run_id` (or of the one run whose id starts with it), as resume finds it."""
    check_store_dir(store)
    return open_runs(store).find(run_id)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def item(i: int, status: str = "PASS") -> dict:
    return Result(f"t{i}", 0, "onnx_cpu_fp32", Verdict(status), test_type="op").to_json()


def test_environment_has_versions_machine_and_none_for_missing():
    from opdiff_snap.core.environment import differences, environment, package_version

    env = environment(threads=3)
    for key in ("python", "os", "machine", "host", "torch", "executorch", "onnxruntime", "onnx",
                "coremltools", "numpy", "zarr", "duckdb", "opdiff_snap", "os_version"):
        assert key in env
    assert env["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert env["opdiff_snap"] == "0.1.0"
    assert package_version(("surely-not-an-installed-dist-xyz",)) is None
    assert env["cpu"]["model"] and env["cpu"]["cores"] == os.cpu_count()
    assert env["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    if sys.platform.startswith("linux") and "avx2" in open("/proc/cpuinfo").read():
        assert "avx2" in env["cpu"]["isa"]
    assert env["torch_build"]["blas"] and env["threads"] == {"intra_op": 3, "inter_op": 1}
    other = {**env, "cpu": {**env["cpu"], "model": "Other CPU"}, "threads": {"intra_op": 1, "inter_op": 1}}
    assert differences(env, other) == [("cpu.model", env["cpu"]["model"], "Other CPU"),
                                       ("threads.intra_op", 3, 1)]


def test_meta_item_end_written_and_flushed_per_line(tmp_path):
    w = start(tmp_path, baseline_preset="torch_cpu_fp32")
    assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{6}", w.run_id)
    assert w.path == tmp_path / "runs" / f"{w.run_id}.jsonl"
    meta = lines(w.path)[0]    # readable before anything else happens
    assert meta["type"] == "meta" and meta["run_id"] == w.run_id and meta["command"] == "check"
    assert meta["presets"] == PRESETS and meta["settings"] == SETTINGS
    assert meta["baseline_preset"] == "torch_cpu_fp32" and meta["env"]["torch"]
    assert {"host", "os", "machine", "started", "argv", "suites"} <= set(meta)
    w.item(item(0))
    got = lines(w.path)       # the item is on disk before end()
    assert len(got) == 2 and got[1]["type"] == "item" and got[1]["run_id"] == w.run_id
    assert got[1]["id"] == "t0" and "ts" in got[1]
    w.item(item(1, "MISMATCH"))
    w.end({"PASS": 1, Verdict.MISMATCH: 1}, 1.5)
    end = lines(w.path)[-1]
    assert end == {"type": "end", "run_id": w.run_id, "finished": end["finished"], "wall_s": 1.5,
                   "counts": {"PASS": 1, "MISMATCH": 1}, "resumed": 0}
    run = read_run(w.path)
    assert run.complete and len(run.items) == 2 and not run.problems
    # meta keys never reuse an item key with another type (DuckDB auto-detection)
    shared = set(meta) & set(got[1])
    assert shared == {"type", "run_id"}


def test_item_with_nan_metrics_stays_strict_json(tmp_path):
    nan = float("nan")
    cmp = compare(torch.tensor([1.0, nan]), torch.tensor([nan, 2.0]), Tolerance(1e-5, 1e-5))
    rec = Result("t", 0, "p", cmp.verdict, metrics=cmp.metrics,
                 tolerance=Tolerance(1e-5, 1e-5)).to_json()
    with start(tmp_path) as w:
        w.item(rec)
        w.item({"id": "u", "seed": 0, "preset": "p", "status": "PASS", "x": float("-inf")})
    for line in w.path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert lines(w.path)[2]["x"] == "-inf"


def test_exception_inside_the_writer_leaves_no_end_line(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with start(tmp_path) as w:
            w.item(item(0))
            raise KeyboardInterrupt
    run = read_run(w.path)
    assert run.end is None and len(run.items) == 1
    assert not list_runs(tmp_path)[0].complete


def test_truncated_last_line_is_skipped_and_reported(tmp_path):
    with start(tmp_path) as w:
        w.item(item(0))
        w.item(item(1))
    with open(w.path, "ab") as f:
        f.write(b'{"type": "item", "id": "t2", "se')
    run = read_run(w.path)
    assert [i["id"] for i in run.items] == ["t0", "t1"] and run.end is None
    assert run.truncated and len(run.problems) == 1 and "line 4" in run.problems[0]


def test_resume_truncates_partial_line_and_appends_to_the_same_file(tmp_path):
    w = start(tmp_path)
    for i in range(3):
        w.item(item(i))
    w.close()
    with open(w.path, "ab") as f:
        f.write(b'{"type": "item", "id": "t3", "se')
    w2, done = RunWriter.resume(tmp_path, w.run_id)
    assert w2.path == w.path and w2.run_id == w.run_id
    assert done == {(f"t{i}", 0, "onnx_cpu_fp32") for i in range(3)}
    for i in range(3, 5):
        w2.item(item(i, "MISMATCH" if i == 4 else "PASS"))
    w2.end({"PASS": 1, "MISMATCH": 1}, 0.5)
    run = read_run(w.path)
    assert not run.problems and run.complete
    assert [i["id"] for i in run.items] == [f"t{i}" for i in range(5)]
    assert run.end["counts"] == {"PASS": 4, "MISMATCH": 1} and run.end["resumed"] == 3
    assert sum(1 for x in lines(w.path) if x["type"] == "meta") == 1
    with pytest.raises(OpdiffError, match="complete"):
        RunWriter.resume(tmp_path, w.run_id)


# argv: store, items, items to write before waiting to be killed
WRITER_SCRIPT = textwrap.dedent("""
    import sys, time
    from opdiff_snap.history.writer import RunStart, RunWriter
    from opdiff_snap.compare.results import Result
    from opdiff_snap.core.verdicts import Verdict
    w = RunWriter.start(sys.argv[1], RunStart("check", [], [], {}, {}))
    print(w.run_id, flush=True)
    for i in range(int(sys.argv[2])):
        if i == int(sys.argv[3]):
            time.sleep(3600)
        w.item(Result(f"t{i}", 0, "onnx_cpu_fp32", Verdict.PASS).to_json())
    w.end({"PASS": int(sys.argv[2])}, 1.0)
""")


def test_resume_after_sigkill_has_every_item_exactly_once(tmp_path):
    n = 60
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(tmp_path), str(n), "10"],
                            stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
        path = find_run(tmp_path, run_id)
        deadline = time.monotonic() + 60
        while len(read_run(path).items) < 10:
            assert time.monotonic() < deadline, "writer made no progress"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    before = read_run(path)
    assert before.end is None and 10 <= len(before.items) < n

    writer, done = RunWriter.resume(tmp_path, run_id)
    with writer:
        wrote = 0
        for i in range(n):
            if (f"t{i}", 0, "onnx_cpu_fp32") in done:
                continue
            writer.item(item(i))
            wrote += 1
        writer.end({"PASS": wrote}, 0.1)
    run = read_run(path)
    ids = [x["id"] for x in run.items]
    assert sorted(ids, key=lambda s: int(s[1:])) == [f"t{i}" for i in range(n)]
    assert len(set(ids)) == n and run.end["counts"] == {"PASS": n}
    assert run.end["resumed"] == len(before.items)


def test_find_run_errors_and_prefixes(tmp_path):
    with pytest.raises(OpdiffError, match="no runs"):
        find_run(tmp_path, "nope")
    ids = []
    for _ in range(3):
        with start(tmp_path) as w:
            ids.append(w.run_id)
    assert find_run(tmp_path, ids[1]) == tmp_path / "runs" / f"{ids[1]}.jsonl"
    with pytest.raises(OpdiffError) as err:
        find_run(tmp_path, "20991231T000000Z-ffffff")
    assert "not found" in str(err.value) and all(i in str(err.value) for i in ids)
    runs = tmp_path / "runs"
    for name in ("20200101T000000Z-abc123", "20200101T000000Z-abc456"):
        (runs / f"{name}.jsonl").write_text("")
    assert find_run(tmp_path, "20200101T000000Z-abc1").stem == "20200101T000000Z-abc123"
    with pytest.raises(OpdiffError, match="ambiguous"):
        find_run(tmp_path, "20200101T000000Z-abc")


def test_resume_refuses_a_file_without_meta(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "20260101T000000Z-abcdef.jsonl").write_bytes(b'{"type": "me')
    with pytest.raises(OpdiffError, match="meta"):
        RunWriter.resume(tmp_path, "20260101T000000Z-abcdef")


def test_list_runs_oldest_first_with_counts(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    older = {"type": "meta", "run_id": "20260101T000000Z-aaaaaa", "command": "record",
             "started": "2026-01-01T00:00:00.000Z"}
    (runs / "20260101T000000Z-aaaaaa.jsonl").write_text(
        json.dumps(older) + "\n" + json.dumps({"type": "item", "id": "a", "seed": 0, "preset": "p",
                                               "status": "RECORDED"}) + "\n"
        + json.dumps({"type": "end", "run_id": older["run_id"], "counts": {"RECORDED": 1}}) + "\n")
    w = start(tmp_path)
    w.item(item(0))
    w.item(item(1, "CRASH"))
    w.close()
    got = list_runs(tmp_path)
    assert [r.run_id for r in got] == ["20260101T000000Z-aaaaaa", w.run_id]
    assert got[0].complete and got[0].command == "record" and got[0].counts == {"RECORDED": 1}
    assert not got[1].complete and got[1].counts == {"PASS": 1, "CRASH": 1}
    assert got[1].started.endswith("Z")
    assert list_runs(tmp_path / "missing") == []
