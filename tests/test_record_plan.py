"""run.record.plan: what record decides for each (test, seed) from the store's metadata."""

from __future__ import annotations

from pathlib import Path

from helpers.record import make_project

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.goldens import Golden, GoldenStore, store_key
from opdiff_snap.run.record import plan
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.materialize import materialize

SUITE = """\
tests:
  - {id: new, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32, init: normal}]}
  - {id: same, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32, init: normal}]}
  - {id: stale, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32, init: normal}]}
  - {id: other_baseline, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32, init: normal}]}
  - {id: broken, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32, init: normal}]}
  - {id: skipped, op: aten::neg, in: [{type: tensor, shape: [2], dtype: float32, init: normal}],
     skip: {torch_cpu_fp32: "not on the baseline"}}
"""


def golden(case, baseline: str, spec_hash: str | None = None) -> Golden:
    inv = materialize(case, 0)
    return Golden(test_id=case.id, seed=0, spec_hash=spec_hash or case.spec_hash, suite=str(case.suite),
                  definition=dict(case.definition), test_type=case.test_type, baseline={"name": baseline},
                  env={}, created="2026-01-01T00:00:00Z", invocation=inv, outputs=-inv.args[0])


def test_plan_decides_from_metadata(tmp_path: Path):
    project = make_project(tmp_path, SUITE, models=False)
    cases = {c.id: c for c in load_suites([project / "suites" / "s.yaml"])}
    store = GoldenStore(project / "goldens")
    store.write(golden(cases["same"], "torch_cpu_fp32"))
    store.write(golden(cases["stale"], "torch_cpu_fp32", spec_hash="an-older-spec"))
    store.write(golden(cases["other_baseline"], "onnx_cpu_fp32"))
    store.write(golden(cases["broken"], "torch_cpu_fp32"))
    (store.root / store_key("broken", 0) / "zarr.json").write_text("{not json")
    preset = get_preset("torch_cpu_fp32")

    decided = {p.case.id: p for p in plan(list(cases.values()), store, preset)}
    assert {k: p.verdict for k, p in decided.items()} == {
        "new": None, "same": Verdict.KEPT, "stale": None, "other_baseline": None, "broken": None,
        "skipped": Verdict.SKIPPED}
    assert decided["new"].why == "new golden"
    assert decided["stale"].why.startswith("stale")
    assert "onnx_cpu_fp32" in decided["other_baseline"].why
    assert "unreadable" in decided["broken"].why
    assert decided["skipped"].why == "not on the baseline"

    forced = {p.case.id: p for p in plan(list(cases.values()), store, preset, force=True)}
    assert forced["same"].verdict is None and "--force" in forced["same"].why
    assert forced["skipped"].verdict is Verdict.SKIPPED      # a suite's exclusion holds even with --force

    seeds = [(p.case.id, p.seed) for p in plan([cases["same"]], store, preset, seed_list=[0, 3])]
    assert seeds == [("same", 0), ("same", 3)]
    assert [p.verdict for p in plan([cases["same"]], store, preset, seeds=2)] == [Verdict.KEPT, None]
