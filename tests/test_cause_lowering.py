"""Every op a backend cannot lower, at once: check lists them all in its result (and the
history's SQL), each with the source line it comes from, for ONNX Runtime, ExecuTorch and
CoreML conversion on real backends; localize on a CoreML conversion failure off macOS
never blames a submodule that converts; answers are cached per backend version; `opdiff
ops` tables them for suites and says what changed after an upgrade."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from click.testing import CliRunner
from helpers.lowering import MODELS, SUITE, line_of

from opdiff_snap import api
from opdiff_snap.backends.registry import get_preset
from opdiff_snap.cli import main
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution import op_support
from opdiff_snap.execution.op_support import OpSupportCache

# (test, preset, the ops it cannot lower with their stage and the marker on their source line)
GAPS = {
    ("onnx_gaps", "onnx_cpu_fp32"): [("aten::special_i0.default", "EXPORT_FAIL", "# gap: i0"),
                                     ("aten::lgamma.default", "EXPORT_FAIL", "# gap: lgamma")],
    # digamma stops lowering; sort lowers but the runtime has no kernel for it (load)
    ("executorch_gaps", "executorch_cpu_fp32"): [("aten::digamma.default", "EXPORT_FAIL", "# gap: digamma"),
                                                 ("aten::sort.default", "LOAD_FAIL", "# gap: sort")],
    # CoreML converts here and predicts only on macOS: conversion alone decides
    ("coreml_gaps", "coreml_any_fp16"): [("aten::diff.default", "EXPORT_FAIL", "# gap: diff"),
                                         ("aten::xlogy.Tensor", "EXPORT_FAIL", "# gap: xlogy")],
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The fixture suite recorded, then each test checked on the preset it has gaps on."""
    root = tmp_path_factory.mktemp("lowering")
    settings = Settings(suites=SUITE.parent, goldens=root / "goldens", store=root / "store", cache=root / "cache",
                        jobs=2, repeats=1)
    api.record(api.RecordRequest(selection=api.Selection(suites=[SUITE]), running=api.Running(in_process=True)),
                                 settings=settings)
    results = {}
    for test_id, preset in GAPS:
        report = api.check(api.CheckRequest(backends=[preset],
                                            selection=api.Selection(suites=[SUITE], test_ids=[test_id]),
                                            running=api.Running(in_process=True)), settings=settings)
        (r,) = report.results
        results[(test_id, preset)] = r
    return settings, results


@pytest.mark.slow
@pytest.mark.parametrize("test_id, preset", list(GAPS), ids=[p for _, p in GAPS])
def test_check_lists_every_op_the_backend_cannot_lower_with_its_source_line(checked, test_id, preset):
    _, results = checked
    r = results[(test_id, preset)]
    assert r.verdict is Verdict.EXPORT_FAIL, r.message
    assert r.unsupported_ops is not None, r.message
    want = GAPS[(test_id, preset)]
    assert [(u.op, u.stage) for u in r.unsupported_ops] == [(op, stage) for op, stage, _ in want]
    for u, (_, _, marker) in zip(r.unsupported_ops, want):
        assert u.count == 1 and u.error
        assert u.source_paths == [f"{MODELS}:{line_of(marker)}"]
        assert marker in u.sources[0]


def test_the_history_answers_which_ops_block_each_preset_in_sql(checked):
    settings, _ = checked
    table = api.query("SELECT preset, u.op, u.stage, u.count FROM results, unnest(unsupported_ops) AS t(u) "
                      "ORDER BY preset, u.op", settings)
    got = sorted((p, op, stage) for p, op, stage, _ in table.rows)
    assert got == sorted((preset, op, stage) for (_, preset), ops in GAPS.items() for op, stage, _ in ops)


def test_localize_on_a_conversion_failure_never_names_a_submodule_that_converts(checked):
    from opdiff_snap.cause.localize_report import format_report

    settings, _ = checked
    report = api.localize("coreml_gaps", "coreml_any_fp16", goldens=settings.goldens, settings=settings)
    text = format_report(report)
    # both Linear layers convert (their prediction is only unavailable here): neither is blamed
    assert {r.name: r.status for r in report.rows} == {"fc": Verdict.UNAVAILABLE, "out": Verdict.UNAVAILABLE}
    assert report.first_divergent is None, text
    assert report.lowering is not None, text
    assert [u.op for u in report.lowering.ops] == ["aten::diff.default", "aten::xlogy.Tensor"]
    # the op-support answers check already has are reused
    assert report.lowering.asked == 0, text
    assert report.divergence == "failed"
    assert "cannot lower 2 ops" in report.summary() and "fc" not in report.summary()
    data = json.loads(json.dumps(report.to_json()))   # what --format json prints
    assert [u["op"] for u in data["lowering"]["ops"]] == ["aten::diff.default", "aten::xlogy.Tensor"]
    assert data["first_divergent"] is None and data["converts_only"] is True


def test_answers_are_cached_per_backend_version(checked, monkeypatch):
    from opdiff_snap.execution.op_survey import survey_test
    from opdiff_snap.suite import load_suites
    from opdiff_snap.suite.materialize import materialize

    settings, _ = checked
    case = next(c for c in load_suites([SUITE]) if c.id == "onnx_gaps")
    preset = get_preset("onnx_cpu_fp32")
    again = survey_test(case, materialize(case, 0), preset, settings.cache)
    assert again.asked == 0 and again.calls > 2
    assert [u.op for u in again.ops] == ["aten::special_i0.default", "aten::lgamma.default"]
    # another onnxruntime: every answer is asked again (and the old ones stay, for --changes)
    real = op_support.runtime_versions
    monkeypatch.setattr(op_support, "runtime_versions", lambda p: {**real(p), "onnxruntime": "0.0.0-other"})
    assert OpSupportCache(settings.cache).get(preset, "aten::lgamma.default", again.ops[1].signatures[0]) is None


def test_opdiff_ops_tables_support_per_preset_and_the_changes_after_an_upgrade(checked, tmp_path):
    settings, _ = checked
    cache = tmp_path / "cache"
    shutil.copytree(settings.cache, cache)
    base = ["--suites", str(SUITE.parent), "--cache", str(cache), "ops", str(SUITE), "-j", "2",
            "-b", "onnx_cpu_fp32", "-b", "coreml_any_fp16"]
    out = CliRunner().invoke(main, [*base, "--format", "json"])
    assert out.exit_code == 1, out.output          # some op does not lower
    rows = {r["op"]: r for r in json.loads(out.stdout)}
    assert rows["aten::diff.default"]["onnx_cpu_fp32"] == "yes"
    assert rows["aten::diff.default"]["coreml_any_fp16"] == "no"
    assert rows["aten::lgamma.default"]["onnx_cpu_fp32"] == "no"
    assert rows["aten::linear.default"]["tests"] == 4   # every module of the suite has a Linear
    # a cached answer of an older coremltools that converted diff: --changes reports it
    store = OpSupportCache(cache)
    preset = get_preset("coreml_any_fp16")
    now = next(v for v in store.entries() if v.preset == preset.name and v.op == "aten::diff.default")
    older = replace(now, lowers=True, stage=None, error="", asked=now.asked - 3600,
                    versions={**now.versions, "coremltools": "8.3.0"})
    path = store.dir / preset.name / "older-diff.json"
    path.write_text(json.dumps({k: getattr(older, k) for k in older.__dataclass_fields__}))
    out = CliRunner().invoke(main, ["--cache", str(cache), "ops", "--changes", "--format", "json"])
    assert out.exit_code == 0, out.output
    (change,) = json.loads(out.stdout)
    assert change["op"] == "aten::diff.default" and change["preset"] == "coreml_any_fp16"
    assert (change["lowered before"], change["lowers now"]) == ("yes", "no")
    assert "coremltools 8.3.0 -> 9.0" in change["versions"]


def test_hostile_op_support_answers_are_asked_again_not_believed(checked, tmp_path):
    """Answers the cache did not write (another type in any field) are left out of
    `ops --changes` and asked again: `lowers: "no"` is never read as yes."""
    settings, _ = checked
    cache = tmp_path / "cache"
    shutil.copytree(settings.cache, cache)
    store = OpSupportCache(cache)
    preset = get_preset("coreml_any_fp16")
    now = next(v for v in store.entries() if v.preset == preset.name and v.op == "aten::diff.default")
    good = {k: getattr(now, k) for k in now.__dataclass_fields__}
    for name, change in {"versions": {"versions": [1, 2]}, "op": {"op": 5}, "signature": {"signature": ["x"]},
                         "lowers": {"lowers": "no"}, "list": None}.items():
        body = [1] if change is None else {**good, **change, "asked": now.asked - 60}
        (store.dir / preset.name / f"hostile-{name}.json").write_text(json.dumps(body))
    assert sorted(v.op for v in store.entries() if v.preset == preset.name and v.op == "aten::diff.default") == [
        "aten::diff.default"]
    (store.dir / preset.name / f"{store.key(preset, now.op, now.signature)}.json").write_text(
        json.dumps({**good, "lowers": "no"}))
    assert store.get(preset, now.op, now.signature) is None
    out = CliRunner().invoke(main, ["--cache", str(cache), "ops", "--changes", "--format", "json"])
    assert out.exit_code == 0 and "Traceback" not in out.output, out.output
