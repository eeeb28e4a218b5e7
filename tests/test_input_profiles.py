"""Input profiles: each profile of a test is a golden of its own (`<id>@<profile>`), its
floating inputs rewritten to the values random normals never produce, and a backend
wrong only on those values is caught there and missed on the normal inputs."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from helpers.check import make_site, plugin_installed

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.edge_values import REWRITES
from opdiff_snap.suite.materialize import materialize
from opdiff_snap.suite.profiles import EDGE, PROFILES

SUITE = """
tests:
  - id: logp
    op: aten::log.default
    in: [{type: tensor, shape: [4, 8], dtype: float32, init: uniform, low: 0.5, high: 2.0}]
    profiles: [normal, edge]
  - id: half
    op: aten::neg.default
    in: [{type: tensor, shape: [64], dtype: float16}]
    profiles: [max_finite, subnormal]
  - id: lin
    op: {type: module, path: torch.nn.Linear, args: [8, 3]}
    in: [{type: tensor, shape: [16, 8], dtype: float32}]
    profiles: [nonfinite]
  - id: given
    op: aten::neg.default
    in: [{type: const_tensor, shape: [16], dtype: float32, value: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}]
    profiles: [signed_zero]
  - {id: ints, op: aten::neg.default, in: [{type: tensor, shape: [4], dtype: int64, init: randint, low: 0, high: 3}]}
"""


def _suite(root: Path, text: str = SUITE) -> Path:
    (root / "suites").mkdir(parents=True, exist_ok=True)
    path = root / "suites" / "profiles.yaml"
    path.write_text(text)
    return path


def _cases(root: Path, text: str = SUITE) -> dict:
    return {c.id: c for c in load_suites([_suite(root, text)])}


def test_each_profile_is_its_own_test_and_normal_keeps_the_plain_id_and_spec(tmp_path):
    cases = _cases(tmp_path)
    # a float32 test's profiles come in fp16 and bf16 too (tests/test_profile_precisions.py)
    assert list(cases) == ["logp", *(f"logp@{p}{v}" for p in EDGE for v in ("", ".f16", ".bf16")),
                           "half@max_finite", "half@subnormal", "lin@nonfinite", "lin@nonfinite.f16",
                           "lin@nonfinite.bf16", "given@signed_zero", "given@signed_zero.f16",
                           "given@signed_zero.bf16", "ints"]
    plain = _cases(tmp_path / "plain", SUITE.replace("    profiles: [normal, edge]\n", ""))
    assert cases["logp"].spec_hash == plain["logp"].spec_hash   # adding profiles leaves the normal golden valid
    assert len({cases[f"logp@{p}"].spec_hash for p in EDGE} | {cases["logp"].spec_hash}) == len(EDGE) + 1
    assert cases["logp@subnormal"].profile == "subnormal" and cases["logp"].profile == "normal"


def test_profiles_rewrite_the_inputs_to_the_values_they_name(tmp_path):
    cases = _cases(tmp_path)
    sub = materialize(cases["logp@subnormal"], 0).args[0]
    tiny = torch.finfo(torch.float32).smallest_normal
    assert ((sub != 0) & (sub.abs() < tiny)).any() and (sub == 0).any()
    assert torch.equal(sub, materialize(cases["logp@subnormal"], 0).args[0])     # seeded: the same twice
    assert not torch.equal(sub, materialize(cases["logp@subnormal"], 1).args[0])

    big = materialize(cases["half@max_finite"], 0).args[0]
    assert big.dtype == torch.float16 and torch.isfinite(big).all()
    assert (big.abs() == torch.finfo(torch.float16).max).any()
    half_sub = materialize(cases["half@subnormal"], 0).args[0]
    fp16_tiny = torch.finfo(torch.float16).smallest_normal
    assert ((half_sub != 0) & (half_sub.abs() < fp16_tiny)).any()

    zeros = materialize(cases["logp@signed_zero"], 0).args[0]
    assert (torch.signbit(zeros) & (zeros == 0)).any() and (~torch.signbit(zeros) & (zeros == 0)).any()
    wide = materialize(cases["logp@wide"], 0).args[0].abs()
    assert float(wide.max() / wide.min()) > 1e6

    inv = materialize(cases["lin@nonfinite"], 0)
    x = inv.args[0]
    assert torch.isnan(x).any() and torch.isposinf(x).any() and torch.isneginf(x).any()
    # module weights are never rewritten: the same state as the test without a profile
    plain = _cases(tmp_path / "plain", SUITE.replace("    profiles: [nonfinite]\n", ""))
    assert all(torch.equal(inv.states["a"][k], v) for k, v in materialize(plain["lin"], 0).states["a"].items())
    assert set(PROFILES) == {"normal", *EDGE} and set(REWRITES) == set(EDGE)
    # a tensor given by value is rewritten too: what is kept is the value written
    given = materialize(cases["given@signed_zero"], 0).args[0]
    kept = given != 0
    assert 0 < int(kept.sum()) < 16 and torch.equal(given[kept], torch.arange(1.0, 17.0)[kept])


@pytest.mark.parametrize("field, fragment", [
    ("profiles: [normal, denormal]", "'denormal' is not an input profile"),
    ("profiles: []", "profiles must be a non-empty list"),
    ("profiles: subnormal", "profiles must be a non-empty list"),
])
def test_a_bad_profile_is_a_suite_problem_at_its_line(tmp_path, field, fragment):
    text = SUITE.replace("profiles: [normal, edge]", field)
    with pytest.raises(OpdiffError) as err:
        _cases(tmp_path, text)
    assert fragment in str(err.value) and "profiles.yaml:6" in str(err.value)


def test_a_profile_on_a_test_without_floating_inputs_is_refused_but_suite_defaults_skip_it(tmp_path):
    text = SUITE.replace("init: randint, low: 0, high: 3}]}", "init: randint, low: 0, high: 3}], profiles: [wide]}")
    with pytest.raises(OpdiffError) as err:
        _cases(tmp_path, text)
    assert "test 'ints'" in str(err.value) and "has no floating tensor input" in str(err.value)
    cases = _cases(tmp_path / "d", "defaults: {profiles: [normal, nonfinite]}\n" + SUITE)
    assert "ints" in cases and "ints@nonfinite" not in cases and "half@subnormal" in cases


def test_a_backend_wrong_only_on_subnormals_is_caught_on_that_profile_and_missed_on_normals(tmp_path):
    root = tmp_path / "p"
    _suite(root)
    site = make_site(tmp_path / "site")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0)
    with plugin_installed(site), contextlib.chdir(root):
        recorded = api.record(api.RecordRequest(selection=api.Selection(test_ids=["logp*"]),
                                                running=api.Running(in_process=True)), settings=settings)
        assert {r.verdict for r in recorded.results} == {Verdict.RECORDED}
        daz = api.check(api.CheckRequest(backends=["perturb_cpu_fp32"], selection=api.Selection(test_ids=["logp*"]),
                                         running=api.Running(in_process=True),
                                         preset_options={"perturb_cpu_fp32": {"daz": True}}), settings=settings)
        right = api.check(api.CheckRequest(backends=["perturb_cpu_fp32"], selection=api.Selection(test_ids=["logp*"]),
                                           running=api.Running(in_process=True)), settings=settings)
    got = {r.test_id: r for r in daz.results}
    assert got["logp"].verdict is Verdict.PASS                 # normal inputs hold no subnormal
    assert got["logp@subnormal"].verdict is Verdict.MISMATCH    # log(subnormal) is finite, log(0) is -inf
    assert got["logp@subnormal"].metrics.failed_bound == "nonfinite"
    assert {t for t, r in got.items() if r.verdict is not Verdict.PASS} == \
        {"logp@subnormal", *(t for t in got if t.endswith((".f16", ".bf16")))}
    # the fp16 and bf16 values are judged on presets computing in those precisions only
    assert {r.verdict for t, r in got.items() if t.endswith((".f16", ".bf16"))} == {Verdict.SKIPPED}
    assert {r.verdict for r in right.results} == {Verdict.PASS, Verdict.SKIPPED}
