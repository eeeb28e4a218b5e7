"""compare/numerics.py: tolerance policy, verdicts and metrics."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from opdiff_snap.backends.base import Preset
from opdiff_snap.compare.numerics import compare
from opdiff_snap.compare.rules import ALLOWANCE_CAP, BASELINE_FACTOR, Rounding
from opdiff_snap.compare.tolerance import DEFAULT_TOLERANCES, tolerance_for
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite.model import Tolerance

T = Tolerance(atol=2.0 ** -10, rtol=2.0 ** -10)   # allowed at |e| = 1: exactly 2**-9
FP32 = DEFAULT_TOLERANCES["fp32"]


def preset(name="onnx_cpu_fp32", precision="fp32", **options) -> Preset:
    family, device, _ = name.split("_")
    return Preset(name, family, device, precision, options)


# ---------------------------------------------------------------- tolerance policy

def test_default_tolerances_follow_precision():
    assert tolerance_for({}, preset()) == Tolerance(1e-5, 1.3e-6, BASELINE_FACTOR)
    assert tolerance_for({}, preset("executorch_cpu_fp16", "fp16")) == Tolerance(1e-5, 1e-3, BASELINE_FACTOR)
    assert tolerance_for({}, preset("torch_cpu_bf16", "bf16")) == Tolerance(1e-5, 1.6e-2, BASELINE_FACTOR)


def test_precedence_field_by_field():
    p = preset("coreml_any_fp16", "fp16", atol=0.5, rtol=0.25)
    table = {"*": Tolerance(1.0, 1.0), "fp16": Tolerance(2.0, None), "coreml_*": Tolerance(None, 3.0),
             "coreml_any_*": Tolerance(4.0, None), "coreml_any_fp16": Tolerance(None, 5.0)}
    # exact name gives rtol, the longest matching glob gives atol
    assert tolerance_for(table, p) == Tolerance(4.0, 5.0, BASELINE_FACTOR)
    # the CLI overrides only what it sets
    assert tolerance_for(table, p, Tolerance(atol=9.0)) == Tolerance(9.0, 5.0, BASELINE_FACTOR)
    del table["coreml_any_fp16"], table["coreml_any_*"]
    assert tolerance_for(table, p) == Tolerance(2.0, 3.0, BASELINE_FACTOR)     # precision atol, glob rtol
    del table["coreml_*"]
    assert tolerance_for(table, p) == Tolerance(2.0, 1.0, BASELINE_FACTOR)     # precision, then "*"
    del table["fp16"], table["*"]
    assert tolerance_for(table, p) == Tolerance(0.5, 0.25, BASELINE_FACTOR)    # preset options
    assert tolerance_for(table, p, preset_override=Tolerance(atol=0.1)) == Tolerance(0.1, 0.25, BASELINE_FACTOR)
    assert tolerance_for({"*": Tolerance(baseline_factor=0.0)}, p) == Tolerance(0.5, 0.25, 0.0)
    fp16 = preset("coreml_any_fp16", "fp16")
    # a tolerance for another precision does not apply
    assert tolerance_for({"fp32": Tolerance(7.0, 7.0)}, fp16) == Tolerance(1e-5, 1e-3, BASELINE_FACTOR)


def test_tolerance_for_accepts_a_test_case_like_object():
    class Case:
        tolerance = {"*": Tolerance(0.5, None)}
    assert tolerance_for(Case(), preset()) == Tolerance(0.5, 1.3e-6, BASELINE_FACTOR)


# ---------------------------------------------------------------- tolerance edges

def test_element_exactly_at_the_bound_passes_and_next_float_fails():
    e = torch.tensor([1.0, -3.0])
    at = torch.tensor([1.0 + 2.0 ** -9, -3.0])
    assert compare(e, at, T).verdict == Verdict.PASS
    above = torch.tensor([np.nextafter(np.float32(1.0 + 2.0 ** -9), np.float32(2)), -3.0])
    c = compare(e, above, T)
    assert c.verdict == Verdict.MISMATCH
    assert c.metrics.mismatched == 1 and c.metrics.worst_index == (0,)
    assert "out: 1 of 2 elements outside" in c.message and "first at (0,)" in c.message


def test_rtol_scales_with_expected_not_actual():
    e, a = torch.tensor([100.0]), torch.tensor([100.5])
    assert compare(e, a, Tolerance(0.0, 0.005)).verdict == Verdict.PASS
    assert compare(a, e, Tolerance(0.0, 0.0049)).verdict == Verdict.MISMATCH


# ---------------------------------------------------------------- NaN / Inf

def test_nan_at_same_positions_passes():
    nan = float("nan")
    e = torch.tensor([1.0, nan, 3.0])
    assert compare(e, e.clone(), FP32).verdict == Verdict.PASS


def test_nan_at_other_positions_fails_with_count_and_first_index():
    nan = float("nan")
    e = torch.tensor([[1.0, nan], [3.0, 4.0]])
    a = torch.tensor([[1.0, 2.0], [nan, 4.0]])
    c = compare(e, a, FP32)
    assert c.verdict == Verdict.MISMATCH
    assert c.metrics.mismatched == 2
    assert "2 of 4 elements with NaN/Inf" in c.message and "first at (0, 1)" in c.message
    assert c.metrics.worst_index == (0, 1)
    assert c.metrics.worst_expected == "nan" and c.metrics.worst_actual == 2.0


def test_inf_sign_and_placement():
    inf = float("inf")
    e = torch.tensor([inf, -inf, 1.0])
    assert compare(e, e.clone(), FP32).verdict == Verdict.PASS
    assert compare(e, torch.tensor([inf, inf, 1.0]), FP32).verdict == Verdict.MISMATCH
    c = compare(e, torch.tensor([inf, -inf, inf]), FP32)
    assert c.verdict == Verdict.MISMATCH and c.metrics.worst_index == (2,)
    assert c.metrics.worst_actual == "inf"
    # a huge tolerance never excuses a non-finite disagreement
    assert compare(e, torch.tensor([1e30, -inf, 1.0]), Tolerance(1e38, 1.0)).verdict == Verdict.MISMATCH


# ---------------------------------------------------------------- exact kinds

def test_integers_compare_exactly():
    e = torch.tensor([10, 20, 30])
    assert compare(e, e.clone(), Tolerance(100.0, 100.0)).verdict == Verdict.PASS
    c = compare(e, torch.tensor([10, 21, 30]), Tolerance(100.0, 100.0))
    assert c.verdict == Verdict.MISMATCH and c.metrics.mismatched == 1
    assert "exact compare" in c.message and "first at (1,)" in c.message


def test_large_int64_off_by_one_fails():
    big = 2 ** 62
    assert compare(torch.tensor([big]), torch.tensor([big + 1]), FP32).verdict == Verdict.MISMATCH


def test_bools_compare_exactly():
    e = torch.tensor([True, False])
    assert compare(e, e.clone(), FP32).verdict == Verdict.PASS
    assert compare(e, torch.tensor([True, True]), FP32).verdict == Verdict.MISMATCH
    assert compare(True, False, FP32).verdict == Verdict.MISMATCH


def test_complex_compares_real_and_imag():
    e = torch.tensor([1 + 1j, 2 - 2j], dtype=torch.complex64)
    assert compare(e, e.clone(), FP32).verdict == Verdict.PASS
    c = compare(e, torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64), FP32)
    assert c.verdict == Verdict.MISMATCH
    assert c.metrics.mismatched == 1 and c.metrics.numel == 2 and c.metrics.worst_index == (1,)
    assert c.metrics.max_abs == 1.0


def test_bfloat16_and_float16_leaves():
    e = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    a = torch.tensor([1.0, 2.015625], dtype=torch.bfloat16)   # one bf16 ulp above 2
    assert compare(e, a, DEFAULT_TOLERANCES["bf16"]).verdict == Verdict.PASS
    # a bf16 leaf is never held tighter than bf16 itself, even under an fp32 preset's tolerance
    assert compare(e, a, FP32).verdict == Verdict.PASS
    far = torch.tensor([1.0, 2.0625], dtype=torch.bfloat16)      # 3% off: beyond bf16's rtol
    assert compare(e, far, FP32).verdict == Verdict.MISMATCH
    h = torch.tensor([1.0], dtype=torch.float16)
    assert compare(h, h + 0.0009765625, DEFAULT_TOLERANCES["fp16"]).verdict == Verdict.PASS
    assert compare(h, h + 0.0009765625, FP32).verdict == Verdict.PASS      # one fp16 ulp
    assert compare(h, h + 0.0078125, FP32).verdict == Verdict.MISMATCH     # eight ulps
    # and a looser explicit tolerance still applies
    assert compare(h, h + 0.0078125, Tolerance(1e-2, 0.0)).verdict == Verdict.PASS


def test_float64_leaf_under_fp32_default_uses_float64_tolerance():
    e = torch.tensor([1.0], dtype=torch.float64)
    a = e + 1e-6
    assert compare(e, a, FP32).verdict == Verdict.MISMATCH          # 1e-7 + 1e-7 allowed
    assert compare(e, a, Tolerance(1e-5, 0.0)).verdict == Verdict.PASS  # an explicit one is kept


# ---------------------------------------------------------------- structure, shape, dtype

def test_structure_mismatch_names_the_path():
    t = torch.zeros(2)
    c = compare((t, {"a": t, "b": t}), (t, {"a": t, "c": t}), FP32)
    assert c.verdict == Verdict.STRUCTURE_MISMATCH and c.metrics is None
    assert "out[1]" in c.message and "'b'" in c.message and "'c'" in c.message
    c = compare((t, [t, {"b": t}]), (t, [t, {"b": 1.0}]), FP32)
    assert c.verdict == Verdict.STRUCTURE_MISMATCH and "out[1][1]['b']" in c.message
    assert compare((t, t), (t,), FP32).verdict == Verdict.STRUCTURE_MISMATCH
    assert compare([t, "x"], [t, "y"], FP32).verdict == Verdict.STRUCTURE_MISMATCH
    assert compare(None, t, FP32).verdict == Verdict.STRUCTURE_MISMATCH
    assert compare((t, None, "s"), (t, None, "s"), FP32).verdict == Verdict.PASS


def test_shape_mismatch_names_path_and_shapes():
    c = compare((torch.zeros(2, 3), torch.zeros(4)), (torch.zeros(2, 3), torch.zeros(3, 2)), FP32)
    assert c.verdict == Verdict.SHAPE_MISMATCH
    assert "out[1]" in c.message and "(4,)" in c.message and "(3, 2)" in c.message


def test_dtype_mismatch_names_path_and_dtypes():
    for e_dt, a_dt in [(torch.float32, torch.float16), (torch.float32, torch.float64),
                       (torch.int64, torch.int32), (torch.float32, torch.int64)]:
        c = compare({"y": torch.ones(3, dtype=e_dt)}, {"y": torch.ones(3, dtype=a_dt)}, FP32)
        assert c.verdict == Verdict.DTYPE_MISMATCH, (e_dt, a_dt)
        assert "out['y']" in c.message and str(e_dt) in c.message and str(a_dt) in c.message


def test_shape_outranks_dtype_outranks_values():
    e = (torch.zeros(2), torch.zeros(2), torch.zeros(2))
    a = (torch.ones(2), torch.zeros(2, dtype=torch.float16), torch.zeros(3))
    assert compare(e, a, FP32).verdict == Verdict.SHAPE_MISMATCH
    assert compare(e[:2], a[:2], FP32).verdict == Verdict.DTYPE_MISMATCH


def test_python_scalar_leaves_use_the_same_rule():
    assert compare((1.0, 3), (1.0 + 1e-9, 3), FP32).verdict == Verdict.PASS
    assert compare((1.0, 3), (1.1, 3), FP32).verdict == Verdict.MISMATCH
    c = compare((1.0, 3), (1.0, 4), FP32)
    assert c.verdict == Verdict.MISMATCH and c.metrics.worst_output == "out[1]"
    assert compare(float("nan"), float("nan"), FP32).verdict == Verdict.PASS


def test_empty_tensors():
    c = compare(torch.empty(0, 3), torch.empty(0, 3), FP32)
    assert c.verdict == Verdict.PASS and c.metrics.numel == 0
    assert json.dumps(c.metrics.to_json(), allow_nan=False)
    assert compare(torch.empty(0, 3), torch.empty(3, 0), FP32).verdict == Verdict.SHAPE_MISMATCH


# ---------------------------------------------------------------- metrics

def test_metrics_against_hand_computed_values():
    e = (torch.tensor([1.0, 2.0]), torch.tensor([[0.0, 4.0]]))
    a = (torch.tensor([1.5, 2.0]), torch.tensor([[1.0, 4.0]]))
    c = compare(e, a, Tolerance(0.1, 0.0))
    m = c.metrics
    assert c.verdict == Verdict.MISMATCH
    assert m.numel == 4 and m.mismatched == 2 and m.mismatched_frac == 0.5
    assert m.max_abs == 1.0
    assert m.mean_abs == pytest.approx(1.5 / 4)
    assert m.mse == pytest.approx((0.25 + 1.0) / 4)
    assert m.max_rel == pytest.approx(0.5)          # 0.5 / 1; the e == 0 entry is left out
    dot, ee, aa = 1.5 + 4 + 0 + 16, 1 + 4 + 0 + 16, 2.25 + 4 + 1 + 16
    assert m.cosine == pytest.approx(dot / math.sqrt(ee * aa))
    # worst = largest excess over allowed: |1 - 0| - 0.1 beats |1.5 - 1| - 0.1
    assert (m.worst_output, m.worst_index) == ("out[1]", (0, 0))
    assert (m.worst_expected, m.worst_actual) == (0.0, 1.0)
    assert m.min_atol == 1.0


def test_worst_is_by_excess_over_allowed_not_abs_diff():
    e = torch.tensor([1000.0, 1.0])
    a = torch.tensor([1001.0, 1.5])   # abs 1.0 at [0] but allowed 1.0 there with rtol 1e-3
    m = compare(e, a, Tolerance(0.0, 1e-3)).metrics
    assert m.worst_index == (1,) and m.max_abs == 1.0


def test_cosine_edge_cases():
    z = torch.zeros(3)
    assert compare(z, z, FP32).metrics.cosine == 1.0
    assert compare(z, torch.ones(3), FP32).metrics.cosine == 0.0
    assert compare(torch.ones(3), -torch.ones(3), FP32).metrics.cosine == pytest.approx(-1.0)


@pytest.mark.parametrize("rtol", [0.0, 1.3e-6, 1e-3, 0.3])
def test_min_atol_is_the_smallest_passing_atol(rtol):
    g = torch.Generator().manual_seed(0)
    e = torch.randn(2000, generator=g) * 10
    a = e + torch.randn(2000, generator=g) * 1e-3
    m = compare(e, a, Tolerance(0.0, rtol)).metrics
    assert compare(e, a, Tolerance(m.min_atol, rtol)).verdict == Verdict.PASS
    if m.min_atol > 0:
        below = float(np.nextafter(m.min_atol, 0.0)) * (1 - 1e-9)
        assert compare(e, a, Tolerance(below, rtol)).verdict == Verdict.MISMATCH


def test_metrics_json_is_strict_json():
    nan, inf = float("nan"), float("inf")
    c = compare(torch.tensor([1.0, nan, inf]), torch.tensor([nan, 1.0, -inf]), FP32)
    d = c.metrics.to_json()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["worst_index"] in ([0], [1], [2])
    assert isinstance(d["worst_expected"], (str, float)) and d["mismatched"] == 3
    assert c.metrics.mismatched == 3 and c.metrics.numel == 3


# ---------------------------------------------------------------- the baseline's own rounding error

def _golden_with_error(error: float):
    """A golden of 1000 values near 1e3 whose float64 reference lies `error` away at one element."""
    e = torch.linspace(900.0, 1100.0, 1000)
    residual = torch.zeros(1000)
    residual[500] = error
    return e, residual


def test_a_difference_within_the_baselines_own_rounding_error_passes():
    e, residual = _golden_with_error(0.0004)     # the baseline's own error: 0.0004 (~6.5 ulps)
    a = e.clone()
    a[10] += 0.0015                               # outside 1e-5 + 1.3e-6 * 902, inside 4 x 0.0004
    plain = compare(e, a, tolerance_for({}, preset()))
    with_ref = compare(e, a, tolerance_for({}, preset()), rounding=Rounding(residual))
    assert plain.verdict is Verdict.MISMATCH and plain.metrics.baseline_error is None
    assert with_ref.verdict is Verdict.PASS
    m = with_ref.metrics
    assert m.baseline_error == pytest.approx(0.0004, rel=1e-6)
    assert m.error_bound == pytest.approx(BASELINE_FACTOR * 0.0004, rel=1e-6) and m.within_rounding == 1


def test_beyond_the_factor_is_a_mismatch_that_names_the_bound():
    e, residual = _golden_with_error(0.0004)
    a = e.clone()
    a[10] += 0.0017                               # over 4 x 0.0004
    c = compare(e, a, tolerance_for({}, preset()), rounding=Rounding(residual))
    assert c.verdict is Verdict.MISMATCH
    assert "rounding bound 0.0016 (4 x the baseline's own float64-measured error 0.0004)" in c.message
    assert c.failing == ("out",)
    off = compare(e, e + torch.where(torch.arange(1000) == 10, 0.0015, 0.0),
                  Tolerance(1e-5, 1.3e-6, 0.0), rounding=Rounding(residual))
    assert off.verdict is Verdict.MISMATCH  # baseline_factor 0: the configured tolerance only


def test_the_allowance_is_capped_so_a_wrong_kernel_stays_a_mismatch():
    e = torch.linspace(0.5, 2.0, 64)
    huge = torch.full((64,), 0.5)                 # a reference that disagrees wildly (a discontinuous op)
    wrong = e * (1 + 2.0 ** -7)
    for precision in ("fp32", "fp16"):
        tol = tolerance_for({}, preset(f"x_cpu_{precision}", precision))
        c = compare(e, wrong, tol, rounding=Rounding(huge, "fp32", precision))
        assert c.verdict is Verdict.MISMATCH, precision
        assert c.metrics.error_bound == pytest.approx(ALLOWANCE_CAP[precision] * 2.0)


def test_reduced_precision_targets_scale_the_error_by_their_unit_roundoff():
    e = torch.linspace(1.0, 2.0, 100)
    residual = torch.full((100,), 2.0 ** -24)     # the fp32 baseline lost half an ulp at 1..2
    signs = torch.tensor([1.0, -1.0]).repeat(50)  # rounding points both ways
    a = e + 3 * 2.0 ** -11 * signs                # 1.5 fp16 ulps off at 1: outside rtol 1e-3 there
    tol16 = tolerance_for({}, preset("x_cpu_fp16", "fp16"))
    assert compare(e, a, tol16).verdict is Verdict.MISMATCH
    c = compare(e, a, tol16, rounding=Rounding(residual, "fp32", "fp16"))
    assert c.verdict is Verdict.PASS and c.metrics.error_bound == pytest.approx(4 * 2.0 ** -24 * 2.0 ** 13)
    # the same difference on an fp32 target is far outside 4 x half an fp32 ulp
    assert compare(e, a, tolerance_for({}, preset()), rounding=Rounding(residual)).verdict is Verdict.MISMATCH
    # the same error all one way is a bias, though every element is within the bound
    biased = compare(e, e + 3 * 2.0 ** -11, tol16, rounding=Rounding(residual, "fp32", "fp16"))
    assert biased.verdict is Verdict.MISMATCH and biased.metrics.failed_bound == "bias"
    assert biased.metrics.mismatched == 0 and "biased (bias bound)" in biased.message


def test_a_result_matching_the_float64_reference_passes_however_far_the_golden_was():
    e = torch.tensor([1.0, 2.0, 3.0])
    residual = torch.tensor([0.0, 0.5, 0.0])      # the golden was 0.5 off at element 1
    a = e + residual                              # the target computed the exact value
    c = compare(e, a, tolerance_for({}, preset()), rounding=Rounding(residual))
    assert c.metrics.error_bound < 0.01           # capped: the bound alone would not pass it
    assert c.verdict is Verdict.PASS and c.metrics.within_rounding == 1
    strict = compare(e, a, Tolerance(1e-5, 1.3e-6, 0.0), rounding=Rounding(residual))
    assert strict.verdict is Verdict.MISMATCH     # baseline_factor 0 turns every rounding rule off


def test_nothing_to_compare_is_a_structure_mismatch():
    for value in (None, (), [], {}, ("a", None)):
        c = compare(value, value, FP32)
        assert c.verdict is Verdict.STRUCTURE_MISMATCH and "nothing to compare" in c.message


def test_one_million_elements():
    # speed is measured by bench/bench_compare.py, not asserted here
    g = torch.Generator().manual_seed(1)
    e = torch.randn(1000, 1000, generator=g)
    a = e + 1e-7 * torch.randn(1000, 1000, generator=g)
    c = compare(e, a, FP32)
    assert c.verdict == Verdict.PASS and c.metrics.numel == 10 ** 6
