"""Compiling tests in batches never changes a verdict: real ONNX export of the shipped
goldens of a few core_aten tests, checked with batches and alone. `i0` cannot be exported
(EXPORT_FAIL) and sits in a batch with passing tests; `mm_bf16` exports but does not load
(LOAD_FAIL); `logcumsumexp` and `native_batch_norm_eval` run and do not PASS."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest
import torch
from click.testing import CliRunner
from helpers.check import assert_same_as_alone, shipped_goldens
from onnx import TensorProto, helper

from opdiff_snap import api
from opdiff_snap.backends.base import Piece as BackendPiece
from opdiff_snap.backends.base import PiecesFailed
from opdiff_snap.backends.onnx_pieces import piece_model
from opdiff_snap.backends.registry import backend_for, get_preset
from opdiff_snap.cli import main
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.batch import CompileBatch, plan_batches
from opdiff_snap.execution.cache import ArtifactCache, cache_key
from opdiff_snap.execution.runner import Job
from opdiff_snap.goldens import GoldenStore
from opdiff_snap.suite import load_suites

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "suites" / "core_aten.yaml"
PASSING = ["abs", "neg", "acos", "add_broadcast"]
OTHERS = {"i0": Verdict.EXPORT_FAIL, "mm_bf16": Verdict.LOAD_FAIL, "logcumsumexp": Verdict.MISMATCH,
          "native_batch_norm_eval": Verdict.SHAPE_MISMATCH}
TESTS = [*PASSING[:2], *OTHERS, *PASSING[2:]]
PRESET = "onnx_cpu_fp32"

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]


def _project(root: Path) -> Settings:
    return shipped_goldens(root, TESTS)


def _check(settings: Settings, batch: int) -> dict:
    from dataclasses import replace

    report = api.check(api.CheckRequest(backends=[PRESET], selection=api.Selection(suites=[SUITE], test_ids=TESTS),
                                        running=api.Running(in_process=True)),
                                        settings=replace(settings, batch=batch))
    return {r.test_id: r for r in report.results}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    batched = _project(tmp_path_factory.mktemp("batched"))
    alone = _project(tmp_path_factory.mktemp("alone"))
    return batched, _check(batched, 8), _check(alone, 1)


def test_batched_and_alone_give_the_same_verdicts_and_messages(both):
    _, batched, alone = both
    assert_same_as_alone(batched, alone, PASSING, OTHERS)


def test_passing_tests_ran_on_their_batch_artifact_and_the_others_alone(both):
    settings, batched, alone = both
    # in suite order, a passing test that ended in a half with `i0` was exported alone too
    from_batches = [t for t in PASSING if batched[t].batch is not None]
    assert len(from_batches) >= 2
    for test_id in from_batches:
        r = batched[test_id]
        assert r.batch >= 2 and not r.cache_hit and r.export_ms is not None
        assert alone[test_id].batch is None
    for test_id in OTHERS:
        assert batched[test_id].batch is None, test_id   # its verdict is from a run alone
    # what the cache keeps for a test rerun alone was made alone
    entries = [json.loads(p.read_text()) for p in Path(settings.cache).glob("*/*/entry.json")]
    by_test = {e["test"]: e for e in entries}
    for test_id in ("logcumsumexp", "native_batch_norm_eval"):
        assert "batch" not in by_test[test_id]
    for test_id in from_batches:
        assert by_test[test_id]["batch"] >= 2


def test_a_warm_re_check_loads_every_artifact_and_exports_nothing(both):
    settings, first, _ = both
    again = _check(settings, 8)
    for test_id in TESTS:
        assert again[test_id].verdict is first[test_id].verdict
        assert again[test_id].cache_hit, test_id
    runs = sorted((Path(settings.store) / "runs").glob("*.jsonl"))
    items = [json.loads(line) for line in runs[-1].read_text().splitlines()]
    assert all(d["cache_hit"] for d in items if d.get("type") == "item")


def _jobs(settings: Settings, ids: list[str]) -> list[Job]:
    cases = {c.id: c for c in load_suites([SUITE])}
    store = GoldenStore(settings.goldens)
    preset = get_preset(PRESET)
    return [Job(case=cases[t], seed=0, invocation=store.read(t, 0).invocation, preset=preset,
                cache_dir=settings.cache, key=t) for t in ids]


def test_a_failing_export_is_taken_out_of_its_batch_and_left_to_its_job(tmp_path):
    settings = _project(tmp_path)
    ids = [*PASSING[:2], "i0", *PASSING[2:]]
    compiled = CompileBatch("b", get_preset(PRESET), _jobs(settings, ids), settings.cache).run()
    assert set(compiled.batches) == set(PASSING)
    assert compiled.calls == 2    # the whole; the exporter named i0's node, so the others once more
    cache = ArtifactCache(settings.cache)
    (i0,) = _jobs(settings, ["i0"])
    assert cache.lookup(cache_key(i0)) is None and cache.failure(cache_key(i0)) is None   # left to its job


def test_batches_are_planned_by_size_leaving_out_what_is_cached(tmp_path):
    settings = _project(tmp_path)
    jobs = _jobs(settings, TESTS)
    assert plan_batches(jobs, 1) == []
    sizes = [len(b.jobs) for b in plan_batches(jobs, 3)]
    assert sizes == [3, 3, 2]
    CompileBatch("b", get_preset(PRESET), jobs[:2], settings.cache).run()
    assert sum(len(b.jobs) for b in plan_batches(jobs, 32)) == len(jobs) - 2
    # workers under another interpreter key their cache by their own versions: they decide
    assert sum(len(b.jobs) for b in plan_batches(jobs, 32, look=False)) == len(jobs)
    # a test that failed on the preset before (other library versions, say) is left out
    ArtifactCache(settings.cache).note_failed(jobs[-1], True)
    assert jobs[-1].key not in [j.key for b in plan_batches(jobs, 32) for j in b.jobs]
    eager = [Job(case=j.case, seed=0, invocation=j.invocation, preset=get_preset("torch_cpu_fp32"),
                 cache_dir=settings.cache, key=j.key) for j in jobs]
    assert plan_batches(eager, 32) == []    # eager torch exports nothing worth batching


def test_batch_must_be_a_whole_number_of_at_least_one(tmp_path):
    result = CliRunner().invoke(main, ["--goldens", str(tmp_path), "check", "-b", PRESET, "--batch", "0"])
    assert result.exit_code == 2
    assert "--batch" in result.output


def _value(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])


def test_a_piece_is_cut_with_only_its_own_inputs_renamed():
    nodes = [helper.make_node("Relu", ["b0_in0"], ["r"]), helper.make_node("Add", ["b1_in0", "b1_in1"], ["s"]),
             helper.make_node("Mul", ["b0_in0", "b1_in0"], ["m"])]
    graph = helper.make_graph(nodes, "batch", [_value("b0_in0"), _value("b1_in0"), _value("b1_in1")],
                              [_value("r"), _value("s"), _value("m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    second = piece_model(model, {"b1_in0": "in0", "b1_in1": "in1"}, ["s"])
    assert [v.name for v in second.graph.input] == ["in0", "in1"]
    assert [n.op_type for n in second.graph.node] == ["Add"]
    assert list(second.graph.node[0].input) == ["in0", "in1"]
    with pytest.raises(ValueError, match="other pieces' inputs"):
        piece_model(model, {"b0_in0": "in0"}, ["m"])


class _Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return (self.fn(torch.sin(x) * 2),)


def test_the_onnx_exporter_names_the_piece_it_failed_on(tmp_path):
    preset = get_preset(PRESET)
    fns = [torch.cos, torch.tanh, torch.special.i0, torch.tanh]
    pieces = [BackendPiece(_Unary(fn).eval(), (torch.randn(3),), 1) for fn in fns]
    with pytest.raises(PiecesFailed) as failed:
        backend_for(preset).export_batch(pieces, preset, tmp_path)
    assert failed.value.pieces == [2]


def test_a_batch_whose_failure_names_no_piece_is_halved(tmp_path, monkeypatch):
    from opdiff_snap.backends.onnx import OnnxBackend

    settings = _project(tmp_path)
    real = OnnxBackend.export_batch

    def anonymous(self, pieces, preset, workdir):
        try:
            return real(self, pieces, preset, workdir)
        except PiecesFailed as exc:
            raise RuntimeError("the exporter failed somewhere") from exc.__cause__

    monkeypatch.setattr(OnnxBackend, "export_batch", anonymous)
    ids = [*PASSING[:2], "i0", *PASSING[2:]]
    compiled = CompileBatch("b", get_preset(PRESET), _jobs(settings, ids), settings.cache).run()
    assert set(compiled.batches) == set(PASSING)
    assert compiled.calls >= 3    # the whole, then its halves


def test_a_crash_on_a_batch_made_artifact_is_rerun_alone(both):
    from opdiff_snap.execution.batch import rerun_alone

    settings, batched, _ = both
    made = next(t for t in PASSING if batched[t].batch)
    alone_made = "logcumsumexp"     # rerun alone in the batched check: its entry was made alone
    (job,) = _jobs(settings, [made])
    (other,) = _jobs(settings, [alone_made])
    assert rerun_alone(job, None, Verdict.CRASH) and rerun_alone(job, None, Verdict.TIMEOUT)
    assert not rerun_alone(other, None, Verdict.CRASH)
    assert not rerun_alone(job, 16, Verdict.PASS)
    assert rerun_alone(other, 16, Verdict.MISMATCH)     # the worker said its artifact was a batch's
    assert not rerun_alone(dataclasses.replace(job, alone=True), None, Verdict.CRASH)


def test_a_test_expected_to_fail_is_exported_alone_from_the_start(tmp_path):
    """The expectations file says which tests fail on the preset: they are planned alone, so
    the batch costs no exporter call for a failing piece and no test runs twice; their
    verdicts are the same."""
    from dataclasses import replace

    settings = replace(_project(tmp_path), batch=8)
    (tmp_path / "expected.yaml").write_text(
        f"{PRESET}:\n  - {{test: i0, verdict: EXPORT_FAIL, reason: no translation}}\n"
        f"  - {{test: logcumsumexp, verdict: MISMATCH, reason: drifts}}\n")
    res = CliRunner().invoke(main, ["--goldens", str(settings.goldens), "--store", str(settings.store), "--cache",
                                    str(settings.cache), "check", str(SUITE), "-b", PRESET, "--batch", "8",
                                    "--in-process", "--expectations", str(tmp_path / "expected.yaml"),
                                    *[a for t in TESTS for a in ("--test-ids", t)]])
    assert res.exit_code == 1, res.output         # mm_bf16 and native_batch_norm_eval: not expected
    assert f"compiling {len(TESTS) - 2} of {len(TESTS)} tests ahead" in res.output
    assert "2 expected" in res.output
    jobs = _jobs(settings, TESTS)
    planned = [j.key for b in plan_batches([dataclasses.replace(j, alone=j.key in ("i0", "logcumsumexp"))
                                            for j in jobs], 8, look=False) for j in b.jobs]
    assert "i0" not in planned and "logcumsumexp" not in planned and "abs" in planned
    # the cache holds logcumsumexp's artifact as made alone, never by a batch
    entries = {e["test"]: e for e in (json.loads(p.read_text()) for p in Path(settings.cache).glob("*/*/entry.json"))}
    assert "batch" not in entries["logcumsumexp"] and entries["abs"]["batch"] >= 2
