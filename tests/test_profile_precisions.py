"""Edge values in the target's precision: a float32 test's edge profiles come in fp16 and
bf16 too (`<id>@<profile>.f16`, `.bf16`), recorded from inputs that dtype holds exactly,
and each is judged only on the presets computing in its precision; elsewhere it is
SKIPPED, with why."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from helpers.check import make_site, plugin_installed
from helpers.numerics.planted import DAZ_ENTRY_POINTS

from opdiff_snap import api
from opdiff_snap.backends.base import Preset
from opdiff_snap.compare.numerics import compare
from opdiff_snap.compare.rules import Rounding
from opdiff_snap.compare.tolerance import tolerance_for
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.materialize import materialize

SUITE = """
tests:
  - id: logp
    op: aten::log.default
    in: [{type: tensor, shape: [4, 8], dtype: float32, init: uniform, low: 0.5, high: 2.0}]
    profiles: [normal, subnormal, max_finite]
  - id: half
    op: aten::neg.default
    in: [{type: tensor, shape: [64], dtype: float16}]
    profiles: [subnormal]
"""
LOGP = ["logp", "logp@subnormal", "logp@subnormal.f16", "logp@subnormal.bf16",
        "logp@max_finite", "logp@max_finite.f16", "logp@max_finite.bf16"]


def _project(root: Path) -> Path:
    (root / "suites").mkdir(parents=True)
    (root / "suites" / "p.yaml").write_text(SUITE)
    return root


def test_a_float32_profile_comes_in_each_precision_with_that_precisions_values(tmp_path):
    cases = {c.id: c for c in load_suites([_project(tmp_path) / "suites" / "p.yaml"])}
    # a float16 test's profile is already in its precision: no variants
    assert list(cases) == [*LOGP, "half@subnormal"]
    assert len({cases[t].spec_hash for t in LOGP}) == len(LOGP)
    for dtype, suffix in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        info = torch.finfo(dtype)
        sub = materialize(cases[f"logp@subnormal.{suffix}"], 0).args[0]
        assert sub.dtype == torch.float32 and torch.equal(sub.to(dtype).float(), sub)   # held exactly
        assert ((sub != 0) & (sub.abs() < info.smallest_normal)).any()
        big = materialize(cases[f"logp@max_finite.{suffix}"], 0).args[0]
        assert torch.equal(big.to(dtype).float(), big) and (big.abs() == info.max).any()
    # the values it keeps are the test's own inputs, as that dtype holds them
    plain = materialize(cases["logp"], 0).args[0]
    kept = materialize(cases["logp@max_finite.f16"], 0).args[0]
    same = kept.abs() < 4
    assert 0 < int(same.sum()) < 32 and torch.equal(kept[same], plain.half()[same])


def _check(backends: list[str], settings: Settings, **options) -> dict:
    got = api.check(api.CheckRequest(backends=backends, selection=api.Selection(test_ids=["logp*", "half*"]),
                                     running=api.Running(in_process=True), **options), settings=settings)
    return {(r.test_id, r.preset): r for r in got.results}


def test_each_precision_is_judged_on_its_presets_and_skipped_elsewhere_with_why(tmp_path):
    root = _project(tmp_path / "p")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0)
    with contextlib.chdir(root):
        recorded = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        assert {r.verdict for r in recorded.results} == {Verdict.RECORDED}   # the baseline records them all
        got = _check(["torch_cpu_fp32", "torch_cpu_fp16", "torch_cpu_bf16"], settings)
    runs = {"torch_cpu_fp32": {"logp", "logp@subnormal", "logp@max_finite"},
            "torch_cpu_fp16": {"logp", "logp@subnormal.f16", "logp@max_finite.f16", "half@subnormal"},
            "torch_cpu_bf16": {"logp", "logp@subnormal.bf16", "logp@max_finite.bf16"}}
    for (test, preset), r in got.items():
        if test in runs[preset]:
            assert r.verdict is Verdict.PASS, (test, preset, r.message)
        else:
            assert r.verdict is Verdict.SKIPPED, (test, preset, r.verdict)
    why = got[("logp@max_finite", "torch_cpu_fp16")].message
    assert "float32 edge values" in why and "<id>@max_finite.f16" in why
    assert "<id>@subnormal.bf16" in got[("logp@subnormal.f16", "torch_cpu_bf16")].message
    assert "judged on the test's own profile (<id>@subnormal)" in got[("logp@subnormal.f16", "torch_cpu_fp32")].message
    # the reasons name no test: a run's summary says each once, however many tests it skips
    assert not any("logp" in r.message for r in got.values() if r.verdict is Verdict.SKIPPED)
    assert "bf16 presets" not in got[("half@subnormal", "torch_cpu_bf16")].message   # it has no bf16 variant


def test_a_backend_wrong_only_on_fp16_subnormals_is_caught_on_the_fp16_profile_and_missed_on_normals(tmp_path):
    root = _project(tmp_path / "p")
    site = make_site(tmp_path / "site", DAZ_ENTRY_POINTS, name="opdiff-daz-test")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0)
    with plugin_installed(site), contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        got = {t: r for (t, _), r in _check(["bugdaz_cpu_fp16"], settings).items()}
    assert got["logp"].verdict is Verdict.PASS                   # normal inputs hold no subnormal
    assert got["logp@max_finite.f16"].verdict is Verdict.PASS
    assert got["logp@subnormal.f16"].verdict is Verdict.MISMATCH  # log(subnormal) is finite, log(0) -inf
    assert got["logp@subnormal"].verdict is Verdict.SKIPPED       # float32 values: not this target's


def test_an_answer_past_the_precisions_largest_finite_is_rightly_inf_there():
    # 65504 * 1.36 and a reciprocal of an fp16 subnormal: no fp16 value comes near them
    e = torch.tensor([1.0, 88818.0, -1.6e7, 2.0])
    a = torch.tensor([1.0, float("inf"), -float("inf"), 2.0])
    zero = torch.zeros(4, dtype=torch.float64)
    fp16 = tolerance_for({}, Preset("x_cpu_fp16", "x", "cpu", "fp16", {}))
    for elementwise in (None, zero):      # judged normwise, and as one elementwise op
        rounding = Rounding(zero, "fp32", "fp16", elementwise)
        assert compare(e, a, fp16, rounding=rounding).verdict is Verdict.PASS
        flipped = a * torch.tensor([1.0, -1.0, 1.0, 1.0])
        assert compare(e, flipped, fp16, rounding=rounding).verdict is Verdict.MISMATCH   # inf of the other sign
        nan = torch.where(torch.isinf(a), float("nan"), a)
        assert compare(e, nan, fp16, rounding=rounding).verdict is Verdict.MISMATCH
        inside = torch.tensor([1.0, 60000.0, -1.6e7, 2.0])         # fp16 holds 60000: inf there is wrong
        assert compare(inside, a, fp16, rounding=rounding).verdict is Verdict.MISMATCH
        saturated = torch.tensor([1.0, 65504.0, -65504.0, 2.0])     # fp16's largest finite, as nan_to_num gives
        assert compare(e, saturated, fp16, rounding=rounding).verdict is Verdict.PASS
        assert compare(e, -saturated, fp16, rounding=rounding).verdict is Verdict.MISMATCH
        assert compare(inside, saturated, fp16, rounding=rounding).verdict is Verdict.MISMATCH
    fp32 = tolerance_for({}, Preset("x_cpu_fp32", "x", "cpu", "fp32", {}))
    assert compare(e, a, fp32, rounding=Rounding(zero)).verdict is Verdict.MISMATCH
