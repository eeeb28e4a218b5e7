"""Composite tests on fp16 judged against what torch itself achieves at that precision.

Real runs through the API: goldens recorded on torch_cpu_fp32 (with their float64
references), checked on torch eager in float16 (correct, and the precision control
itself), on a backend that accumulates its matrix products in float16 (each op correct,
only precision lost: bugaccum_cpu_fp16), and on the planted-bug backends of
helpers/numerics/planted.py over shipped zoo models."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.check import make_site, plugin_installed, shipped_goldens
from helpers.numerics.planted import ACCUMULATION, ENTRY_POINTS, PRESETS

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite.model import Tolerance

HERE = Path(__file__).resolve().parent / "helpers" / "numerics"
WIDE = ["wide_mlp", "wide_bmm"]      # products over 512 terms: where accumulating in fp16 shows
NORM = "offset_norm"                  # where float16 itself fails the golden's tolerance

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("site"), ENTRY_POINTS, "opdiff-precision-test")
    with plugin_installed(site):
        yield site


def _settings() -> Settings:
    return Settings(suites=Path("suites"), repeats=1, warmup=0, jobs=1)


@pytest.fixture(scope="module")
def wide(site, tmp_path_factory):
    root = tmp_path_factory.mktemp("wide")
    (root / "suites").mkdir()
    for name in ("wide.yaml", "mods.py"):
        shutil.copy(HERE / name, root / "suites" / name)
    with contextlib.chdir(root):
        recorded = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=_settings())
    assert {r.verdict for r in recorded.results} == {Verdict.RECORDED}
    return root


def _check(root: Path, backends: list[str], test_ids=None, **kw) -> dict:
    with contextlib.chdir(root):
        report = api.check(api.CheckRequest(backends, api.Selection(test_ids=test_ids),
                                            api.Running(in_process=True), **kw), settings=_settings())
    return {(r.test_id, r.preset): r for r in report.results}


def test_torch_in_fp16_fails_the_tolerance_and_passes_as_good_as_itself(wide):
    before = _check(wide, ["torch_cpu_fp16"], tolerance=Tolerance(precision_factor=0.0))
    after = _check(wide, ["torch_cpu_fp16"])
    old, new = before[(NORM, "torch_cpu_fp16")], after[(NORM, "torch_cpu_fp16")]
    assert old.verdict is Verdict.MISMATCH and old.precision_limited, old.message
    assert old.metrics.torch_multiple is None                       # the allowance was off
    assert new.verdict is Verdict.PASS, new.message
    assert new.metrics.torch_multiple <= 1.0 and new.metrics.as_torch > 0
    assert new.precision_limited            # torch itself fails the golden's tolerance there
    assert new.message.startswith("as good as torch's own fp16")
    for test in WIDE:                       # within the tolerance anyway: nothing to forgive
        assert after[(test, "torch_cpu_fp16")].verdict is Verdict.PASS
        assert after[(test, "torch_cpu_fp16")].metrics.as_torch == 0


def test_accumulating_products_in_fp16_is_a_mismatch_with_its_multiple(wide):
    results = _check(wide, [ACCUMULATION])
    for test in WIDE:
        r = results[(test, ACCUMULATION)]
        assert r.verdict is Verdict.MISMATCH, (test, r.message)
        assert r.metrics.torch_multiple >= 4.0, r.metrics.torch_multiple   # at least 4x worse than torch
        assert r.metrics.torch_factor == 1.75
        assert "x torch's own in fp16, above the 1.75x allowed" in r.message
        assert not r.precision_limited


def test_the_multiple_is_overridable_per_test_and_preset_and_from_the_cli(wide):
    loose = _check(wide, [ACCUMULATION], tolerance=Tolerance(precision_factor=1000.0))
    assert all(loose[(t, ACCUMULATION)].verdict is Verdict.PASS for t in WIDE)
    suite = wide / "suites" / "wide.yaml"
    text = suite.read_text()
    try:
        suite.write_text(text.replace(
            "{id: wide_mlp, op:", "{id: wide_mlp, tolerance: {bugaccum_cpu_fp16: {precision_factor: 1000}}, op:"))
        with contextlib.chdir(wide):
            api.record(api.RecordRequest(running=api.Running(in_process=True), force=True), settings=_settings())
        per_test = _check(wide, [ACCUMULATION, "torch_cpu_fp16"])
    finally:
        suite.write_text(text)
        with contextlib.chdir(wide):
            api.record(api.RecordRequest(running=api.Running(in_process=True), force=True), settings=_settings())
    assert per_test[("wide_mlp", ACCUMULATION)].verdict is Verdict.PASS
    assert per_test[("wide_mlp", ACCUMULATION)].tolerance.precision_factor == 1000.0
    assert per_test[("wide_bmm", ACCUMULATION)].verdict is Verdict.MISMATCH


def test_a_repro_script_judges_with_torchs_own_error_as_check_does(wide, tmp_path):
    out = tmp_path / "repro.py"
    with contextlib.chdir(wide):
        api.repro("wide_mlp", "torch_cpu_fp16", out, in_process=True)
    run = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=300)
    last = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and last["verdict"] == "PASS", run.stdout[-2000:]
    assert "x torch eager's own in fp16" in run.stdout


ZOO = ["zoo_bert", "zoo_llama", "zoo_mobilenet_v2"]
CAP = 2.0 ** -9


@pytest.fixture(scope="module")
def zoo(site, tmp_path_factory):
    pytest.importorskip("transformers")
    settings = dataclasses.replace(shipped_goldens(tmp_path_factory.mktemp("zoo"), ZOO), repeats=1, warmup=0)
    report = api.check(api.CheckRequest(backends=["torch_cpu_fp16", *PRESETS, ACCUMULATION],
                                        selection=api.Selection(suites=[settings.suites / "zoo"], test_ids=ZOO),
                                        running=api.Running(in_process=True)), settings=settings)
    return {(r.test_id, r.preset): r for r in report.results}


def test_torch_in_fp16_passes_every_zoo_model(zoo):
    for test in ZOO:
        r = zoo[(test, "torch_cpu_fp16")]
        assert r.verdict is Verdict.PASS, (test, r.message)


@pytest.mark.parametrize("preset", [*PRESETS, ACCUMULATION])
def test_a_planted_bug_is_caught_on_every_zoo_model_it_reaches(zoo, preset):
    """A bug reaches a model when it adds more to the largest error than a correct fp16
    kernel may differ by anywhere in it (bench/bench_verdicts.py's measure): more than
    2^-9 x max|expected| above torch eager's own largest error. Below that the bias bound
    catches some (an offset, a one-ulp drift)."""
    for test in ZOO:
        r, clean = zoo[(test, preset)], zoo[(test, "torch_cpu_fp16")]
        assert r.verdict in (Verdict.PASS, Verdict.MISMATCH), (test, r.message)
        if r.metrics.max_abs > clean.metrics.max_abs + CAP * clean.metrics.max_expected:
            assert r.verdict is Verdict.MISMATCH, (test, preset, r.message)
            assert not r.precision_limited, (test, preset)
    caught = {t for t in ZOO if zoo[(t, preset)].verdict is Verdict.MISMATCH}
    # GELU's tanh form moves a tiny BERT's outputs less than fp16 itself does
    assert caught if preset != "bugapprox_cpu_fp16" else True, preset


def test_the_zoo_models_are_reached_by_most_planted_bugs(zoo):
    reached = {(t, p) for t in ZOO for p in [*PRESETS, ACCUMULATION]
               if zoo[(t, p)].metrics.max_abs > zoo[(t, "torch_cpu_fp16")].metrics.max_abs
               + CAP * zoo[(t, "torch_cpu_fp16")].metrics.max_expected}
    assert len(reached) >= 5 and {p for _, p in reached} >= {"bugsmall_cpu_fp16", ACCUMULATION}


def test_a_convert_only_run_says_what_the_mac_will_judge_against(wide):
    pytest.importorskip("coremltools")
    from opdiff_snap.backends.family_common import IS_MACOS

    if IS_MACOS:
        pytest.skip("CoreML predicts on macOS: the result is a verdict there, not UNAVAILABLE")
    r = _check(wide, ["coreml_any_fp16"], test_ids=[NORM])[(NORM, "coreml_any_fp16")]
    assert r.verdict is Verdict.UNAVAILABLE, r.message
    assert "will be held to 1.75x torch eager's own fp16 error" in r.message


def test_localize_judges_each_piece_against_torchs_own_precision(wide):
    with contextlib.chdir(wide):
        judged = api.localize(NORM, "torch_cpu_fp16", goldens=Path("goldens"), in_process=True,
                              settings=_settings())
        strict = api.localize(NORM, "torch_cpu_fp16", goldens=Path("goldens"), in_process=True,
                              settings=_settings(), tolerance=Tolerance(precision_factor=0.0))
    assert judged.divergence == "none", judged
    assert strict.divergence != "none"
