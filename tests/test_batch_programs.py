"""ExecuTorch compiles a batch of tests into one program when its preset asks
(`batch_program`): real XNNPACK lowering of the shipped goldens of a few core_aten tests,
checked with batches and alone. `i0` cannot be lowered, `argsort` has no kernel in the
runtime (LOAD_FAIL), `convolution_3d` is rejected when it runs (INFER_FAIL) and
`remainder_int` runs and does not PASS: each keeps the verdict and message it has alone,
and a test run on its batch's program reports no latency of its own."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.check import assert_same_as_alone, shipped_goldens

from opdiff_snap import api
from opdiff_snap.backends.registry import get_preset
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.batch import CompileBatch, plan_batches
from opdiff_snap.execution.cache import ArtifactCache, cache_key
from opdiff_snap.execution.runner import Job, run_job
from opdiff_snap.goldens import GoldenStore
from opdiff_snap.suite import load_suites

pytest.importorskip("executorch.exir")

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "suites" / "core_aten.yaml"
PASSING = ["abs", "neg", "acos", "add_broadcast"]
OTHERS = {"i0": Verdict.EXPORT_FAIL, "argsort": Verdict.LOAD_FAIL, "convolution_3d": Verdict.INFER_FAIL,
          "remainder_int": Verdict.MISMATCH}
TESTS = [*PASSING[:2], *OTHERS, *PASSING[2:]]
PRESET = "executorch_cpu_fp32"
OPTIONS = {PRESET: {"batch_program": True}}

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]


def _check(settings, batch: int, options=OPTIONS) -> dict:
    report = api.check(api.CheckRequest(backends=[PRESET], selection=api.Selection(suites=[SUITE], test_ids=TESTS),
                                        running=api.Running(in_process=True), preset_options=options),
                                        settings=replace(settings, batch=batch))
    return {r.test_id: r for r in report.results}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    batched = shipped_goldens(tmp_path_factory.mktemp("batched"), TESTS)
    alone = shipped_goldens(tmp_path_factory.mktemp("alone"), TESTS)
    return batched, _check(batched, 8), _check(alone, 1, options={})


def test_one_program_per_batch_gives_every_test_the_verdict_it_has_alone(both):
    _, batched, alone = both
    assert_same_as_alone(batched, alone, PASSING, OTHERS)


def test_a_test_run_on_its_batch_program_reports_no_latency_and_its_own_delegation(both):
    settings, batched, alone = both
    from_batches = [t for t in PASSING if batched[t].batch is not None]
    assert from_batches
    for test_id in from_batches:
        r = batched[test_id]
        assert r.infer_ms is None and r.verdict is Verdict.PASS
        assert alone[test_id].infer_ms is not None
        # the delegate's share counts this test's own nodes, not its batch's
        assert r.delegation is not None and alone[test_id].delegation is not None
        assert r.delegation.to_json()["ops"] == alone[test_id].delegation.to_json()["ops"]
    for test_id in OTHERS:
        assert batched[test_id].batch is None, test_id
    # a test rerun alone after its batch program did not PASS is timed alone
    assert batched["remainder_int"].infer_ms is not None


def test_a_warm_re_check_of_one_batch_made_test_hits_the_cache(both):
    settings, first, _ = both
    test_id = next(t for t in PASSING if first[t].batch is not None)
    report = api.check(api.CheckRequest(backends=[PRESET],
                                        selection=api.Selection(suites=[SUITE], test_ids=[test_id]),
                                        running=api.Running(in_process=True), preset_options=OPTIONS),
                                        settings=replace(settings, batch=8))
    (r,) = report.results
    assert r.verdict is Verdict.PASS and r.cache_hit and r.batch == first[test_id].batch


def test_without_the_option_nothing_is_batched_and_latency_is_measured(tmp_path):
    settings = shipped_goldens(tmp_path, TESTS)
    cases = {c.id: c for c in load_suites([SUITE])}
    store = GoldenStore(settings.goldens)
    jobs = [Job(case=cases[t], seed=0, invocation=store.read(t, 0).invocation, preset=get_preset(PRESET),
                cache_dir=settings.cache, key=t) for t in PASSING]
    assert plan_batches(jobs, 8) == []
    on = get_preset(PRESET, {"batch_program": True})
    assert len(plan_batches([replace(j, preset=on) for j in jobs], 8)) == 1


def test_a_batch_holding_a_test_whose_kernel_is_missing_is_split_before_it_is_cached(tmp_path):
    settings = shipped_goldens(tmp_path, TESTS)
    cases = {c.id: c for c in load_suites([SUITE])}
    store = GoldenStore(settings.goldens)
    preset = get_preset(PRESET, {"batch_program": True})
    ids = ["abs", "neg", "argsort", "acos"]
    jobs = [Job(case=cases[t], seed=0, invocation=store.read(t, 0).invocation, preset=preset,
                cache_dir=settings.cache, key=t) for t in ids]
    compiled = CompileBatch("b", preset, jobs, settings.cache).run()
    assert "argsort" not in compiled.batches and compiled.calls > 1
    cache = ArtifactCache(settings.cache)
    for job in jobs:
        assert cache.made_by_batch(cache_key(job)) == (job.key in compiled.batches)
    # the programs the batch left are shared on disk, and each test runs on its own
    made = [cache.lookup(cache_key(j)) for j in jobs if j.key in compiled.batches]
    assert made and all(json.loads((Path(e.artifact().path) / "piece.json").read_text())["batch"] >= 2
                        for e in made)
    for job in jobs:
        if job.key in compiled.batches:
            outcome = run_job(job)
            assert outcome.status is None and outcome.infer_ms is None and outcome.batch, job.key
