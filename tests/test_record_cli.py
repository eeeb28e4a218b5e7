"""`opdiff record` and `opdiff goldens`: what is recorded, kept, skipped and failed;
stale detection; --force, seeds and selection; prune, verify, show; user errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers.cli import invoke, run
from helpers.record import make_project, read_plain, record_inproc, statuses
from helpers.tables import row_of, table_rows

from opdiff_snap.core import trees
from opdiff_snap.execution.gradients import record_grads
from opdiff_snap.goldens import GoldenStore, store_key
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.materialize import materialize

SUITE = """\
dims: {B: 2, N: 4}
presets:
  x: {type: tensor, shape: [B, N], dtype: float32, init: normal}
tests:
  - id: add
    op: aten::add.Tensor
    in: [{ref: x}, {ref: x}]
  - id: relu
    op: aten::relu
    in: [{ref: x}]
  - id: net
    op: {type: module, path: "file:models.py::Nested", args: [{type: const, value: 4}]}
    in: [{ref: x}, {type: tensor, shape: [B, N], dtype: bool, init: bernoulli, p: 0.5}]
  - id: lin_grad
    op: {type: module, path: torch.nn.Linear, args: [{type: const, value: 4}, {type: const, value: 2}]}
    in: [{ref: x}]
    grad: true
  - id: skipped_here
    op: aten::neg
    in: [{ref: x}]
    skip: {"torch_*": "known exclusion for the test"}
"""

ALL = {"add", "relu", "net", "lin_grad"}
RELU = "op: aten::relu\n    in: [{ref: x}]"


def run_items(project: Path, run_id: str) -> list[dict]:
    path = project / "store" / "runs" / f"{run_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def recorded(report: dict) -> set[str]:
    return {r["id"] for r in report["results"] if r["status"] == "RECORDED"}


def kept(report: dict) -> set[str]:
    return {r["id"] for r in report["results"] if r["status"] == "KEPT"}


@pytest.mark.slow
def test_stale_detection_force_and_history(tmp_path):
    project = make_project(tmp_path, SUITE)
    code, report = record_inproc(project)
    assert code == 0
    assert recorded(report) == ALL
    assert statuses(report)[("skipped_here", 0)] == "SKIPPED"
    assert not GoldenStore(project / "goldens").info("skipped_here", 0)

    lines = run_items(project, report["run_id"])
    assert [l["type"] for l in lines] == ["meta"] + ["item"] * 5 + ["end"]
    assert lines[0]["command"] == "record" and lines[0]["baseline_preset"] == "torch_cpu_fp32"
    assert {l["id"]: l["status"] for l in lines[1:-1]} == {**{t: "RECORDED" for t in ALL},
                                                           "skipped_here": "SKIPPED"}
    assert all(l["infer_ms"] is not None for l in lines[1:-1] if l["status"] == "RECORDED")
    assert lines[-1]["counts"] == {"RECORDED": 4, "SKIPPED": 1}

    # nothing changed: everything kept, nothing rewritten
    code, report = record_inproc(project)
    assert code == 0 and kept(report) == ALL and not recorded(report)

    # tags and tolerances do not change what is recorded: still kept
    suite = project / "suites" / "s.yaml"
    suite.write_text(suite.read_text().replace(RELU, RELU + "\n    tags: [edited]\n"
                                               "    tolerance: {atol: 0.5, rtol: 0.1}"))
    code, report = record_inproc(project)
    assert kept(report) == ALL

    # edit one test's inputs in the YAML: ls says STALE before, record re-records only it
    suite.write_text(suite.read_text().replace(RELU, "op: aten::relu\n    in: [{type: tensor, shape: [3], "
                                               "dtype: float32, init: normal}]"))
    code, out, _ = invoke(project, "goldens", "ls")
    assert code == 0
    states = {row[0]: row[-1] for row in table_rows(out)}    # test -> state, the last column
    assert states["relu"] == "STALE" and states["add"] == states["net"] == "ok", out
    code, report = record_inproc(project)
    assert recorded(report) == {"relu"} and kept(report) == ALL - {"relu"}
    assert "stale" in next(r["message"] for r in report["results"] if r["id"] == "relu")

    # edit the `file:` module: only the test that uses it is re-recorded
    models = project / "suites" / "models.py"
    models.write_text(models.read_text().replace("self.steps * 2", "self.steps * 3"))
    code, out, _ = invoke(project, "goldens", "ls")
    assert row_of(out, "net")[-1] == "STALE", out
    code, report = record_inproc(project)
    assert recorded(report) == {"net"} and kept(report) == ALL - {"net"}
    golden = GoldenStore(project / "goldens").read("net", 0)
    assert int(golden.outputs[1][1]["n"]) == 21          # the new module's output was recorded

    # --force re-records everything
    code, report = record_inproc(project, "--force")
    assert code == 0 and recorded(report) == ALL


@pytest.mark.slow
def test_seeds_seed_list_and_test_ids(tmp_path):
    project = make_project(tmp_path, SUITE)
    code, report = record_inproc(project, "--test-ids", "add", "--seeds", "2")
    assert code == 0
    assert set(statuses(report)) == {("add", 0), ("add", 1)}
    code, report = record_inproc(project, "--test-ids", "add;rel*", "--seed-list", "0,3")
    assert statuses(report) == {("add", 0): "KEPT", ("add", 3): "RECORDED",
                                ("relu", 0): "RECORDED", ("relu", 3): "RECORDED"}
    index = {(i.test_id, i.seed) for i in GoldenStore(project / "goldens").index()}
    assert index == {("add", 0), ("add", 1), ("add", 3), ("relu", 0), ("relu", 3)}
    # a selection that matches nothing is a user error, not a silent no-op
    code, _, err = invoke(project, "record", "--test-ids", "nothing_like_this")
    assert code == 2 and "nothing_like_this" in err


@pytest.mark.slow
def test_prune_verify_and_show(tmp_path):
    project = make_project(tmp_path, SUITE)
    code, report = record_inproc(project)
    assert code == 0
    store = GoldenStore(project / "goldens")

    # show: inputs, params, outputs, metadata; gradients of a grad: true test
    code, out, _ = invoke(project, "goldens", "show", "net")
    assert code == 0
    for text in ("args[0]", "lin.weight", "steps", "outputs", "spec_hash", "torch_cpu_fp32"):
        assert text in out, (text, out)
    code, out, _ = invoke(project, "goldens", "show", "lin_grad")
    assert code == 0 and "gradients of lin_grad" in out and "cotangent[0]" in out and "weight" in out
    code, _, err = invoke(project, "goldens", "show", "nope")
    assert code == 2 and "no golden for test 'nope'" in err

    # verify: clean, then one flipped byte in a chunk names the golden
    code, out, _ = invoke(project, "goldens", "verify")
    assert code == 0 and "4 goldens checked, 0 corrupt" in out
    chunk = project / "goldens" / store_key("relu", 0) / "0"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 0x10
    chunk.write_bytes(bytes(data))
    code, out, _ = invoke(project, "goldens", "verify")
    assert code == 1 and "CORRUPT relu seed=0" in out and "1 corrupt" in out
    # --force heals it
    code, report = record_inproc(project, "--test-ids", "relu", "--force")
    assert recorded(report) == {"relu"}
    assert invoke(project, "goldens", "verify")[0] == 0

    # prune: dry run lists orphans and deletes nothing; --yes deletes; no suites: refuse
    suite = project / "suites" / "s.yaml"
    text = suite.read_text()
    suite.write_text(text[:text.index("  - id: relu")] + text[text.index("  - id: net"):])
    code, out, _ = invoke(project, "goldens", "prune")
    assert code == 0 and "would delete relu seed=0" in out and "dry run" in out
    assert store.info("relu", 0) is not None
    code, out, _ = invoke(project, "goldens", "prune", "--yes")
    assert code == 0 and "deleted relu seed=0" in out
    assert store.info("relu", 0) is None
    assert {i.test_id for i in store.index()} == ALL - {"relu"}
    (tmp_path / "empty").mkdir()
    code, _, err = invoke(project, "--suites", str(tmp_path / "empty"), "goldens", "prune", "--yes")
    assert code == 2 and "refusing to prune" in err
    assert len(store.index()) == 3


BAD_SUITE = """\
tests:
  - id: ok_first
    op: aten::mul.Tensor
    in: [{type: tensor, shape: [2, 3], dtype: float32, init: normal},
         {type: tensor, shape: [2, 3], dtype: float32, init: normal}]
  - id: bad_args
    op: aten::add.Tensor
    in: [{type: tensor, shape: [2, 3], dtype: float32, init: normal},
         {type: tensor, shape: [5, 3], dtype: float32, init: normal}]
  - id: raises_in_forward
    op: {type: module, path: "file:models.py::Raises"}
    in: [{type: tensor, shape: [2, 2], dtype: float32, init: normal}]
  - id: grad_without_float_output
    op: aten::eq.Tensor
    in: [{type: tensor, shape: [2, 3], dtype: float32, init: normal},
         {type: tensor, shape: [2, 3], dtype: float32, init: normal}]
    grad: true
  - id: ok_last
    op: aten::neg
    in: [{type: tensor, shape: [4], dtype: float32, init: normal}]
"""


@pytest.mark.slow
def test_baseline_failures_never_stop_the_run(tmp_path):
    """An op called with bad arguments, a module raising in forward, and a grad: true test
    whose gradients cannot be taken: BASELINE_FAIL, no golden, the rest recorded, exit 1."""
    project = make_project(tmp_path, BAD_SUITE)
    code, report = record_inproc(project)
    assert code == 1
    assert statuses(report) == {("ok_first", 0): "RECORDED", ("bad_args", 0): "BASELINE_FAIL",
                                ("raises_in_forward", 0): "BASELINE_FAIL",
                                ("grad_without_float_output", 0): "BASELINE_FAIL", ("ok_last", 0): "RECORDED"}
    messages = {r["id"]: r["message"] for r in report["results"]}
    # our framing names the baseline and the stage; the words after it are torch's own
    assert messages["bad_args"].startswith("baseline torch_cpu_fp32: EXPORT_FAIL: preparing the test failed")
    assert "this module always fails in forward" in messages["raises_in_forward"]
    assert "recording gradients" in messages["grad_without_float_output"]
    assert {i.test_id for i in GoldenStore(project / "goldens").index()} == {"ok_first", "ok_last"}
    items = run_items(project, report["run_id"])
    assert items[-1]["type"] == "end" and items[-1]["counts"] == {"RECORDED": 2, "BASELINE_FAIL": 3}
    fail = next(i for i in items if i.get("id") == "raises_in_forward")
    assert fail["status"] == "BASELINE_FAIL" and "always fails" in fail["error_message"]
    # --fail-on can make failures not fatal
    code, _ = record_inproc(project, "--fail-on", "CRASH")
    assert code == 0


def test_grads_recorded_and_readable_with_plain_zarr(tmp_path):
    project = make_project(tmp_path, SUITE)
    code, report = record_inproc(project, "--test-ids", "lin_grad;add")
    assert code == 0 and recorded(report) == {"lin_grad", "add"}
    stored = read_plain(project / "goldens")
    assert stored["add|0"]["grads"] is None
    g = stored["lin_grad|0"]
    case = next(c for c in load_suites([project / "suites" / "s.yaml"]) if c.id == "lin_grad")
    cotangent, grads = record_grads(case, materialize(case, 0), 0)
    structure, leaves = trees.flatten({"cotangent": cotangent, "grads": grads})
    assert g["grads"] == structure
    assert len(leaves) == 4  # cotangent, d/d input, d/d weight, d/d bias
    for i, t in enumerate(leaves):
        got = g["arrays"][f"grads.{i}"]
        assert got["shape"] == list(t.shape) and got["torch_dtype"] == "float32"
        assert bytes.fromhex(got["hex"]) == bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    assert any(t.abs().sum() > 0 for t in leaves[1:])
    # and through the store's own reader
    golden = GoldenStore(project / "goldens").read("lin_grad", 0)
    assert torch.equal(golden.grads.grads["params"]["weight"], grads["params"]["weight"])


def one_paragraph(err: str) -> bool:
    return "Traceback" not in err and err.startswith("opdiff: error: ") and err.strip().count("\n") == 0


@pytest.mark.slow
def test_user_errors_exit_2_with_one_paragraph(tmp_path):
    """Real subprocesses: the exit code and stderr are what a user sees."""
    project = make_project(tmp_path, SUITE)
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1")
    proc = run(project, "record", "--baseline", "torch_cpu_fp23", env=env, timeout=180)
    assert proc.returncode == 2 and one_paragraph(proc.stderr), proc.stderr
    assert "Did you mean 'torch_cpu_fp32'" in proc.stderr

    proc = run(project, "record", "--baseline", "coreml_any_fp32", env=env, timeout=180)
    assert proc.returncode == 2 and one_paragraph(proc.stderr), proc.stderr
    assert "cannot be the baseline on this machine" in proc.stderr and "macOS" in proc.stderr

    (project / "suites" / "s.yaml").write_text("tests:\n  - id: x\n    op: aten::relu\n"
                                               "    in: [{type: tensr, shape: [2]}]\n")
    proc = run(project, "record", env=env, timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "s.yaml" in proc.stderr and "tensr" in proc.stderr
    assert not (project / "goldens").exists() and not (project / "store").exists()
