"""The verdict of a comparison, its message and its metrics.

`compare(expected, actual, tol)` walks two nested values (tensors, tuples, lists, dicts,
Python scalars, None, strings) and decides one verdict, in this order of precedence:

    STRUCTURE_MISMATCH  nesting, lengths, keys, tensor vs non-tensor, or constants differ,
                        or there is nothing to compare (no tensor or number anywhere)
    SHAPE_MISMATCH      a tensor leaf has another shape
    DTYPE_MISMATCH      a tensor leaf has another dtype (any width or kind change)
    MISMATCH            values differ (see below), integers/bools not exactly equal,
                        NaN/Inf not at the same places
    PASS

A floating element passes when any of these holds (docs/check.md explains why):

    |a - e| <= atol + rtol * |e|                      the configured tolerance
    |a - e| <= min(factor * E * u_t / u_b, cap * M)   the baseline's own rounding error
    |a - r| <= atol + rtol * |r|                      the float64 reference itself

where r is the golden's float64 reference (when it has one), E the largest |e - r| over
the output, M its largest |e|, u_t and u_b the unit roundoff the target and the baseline
compute that output in, and cap a per-precision ceiling far below any real kernel error.

Two more bounds hold on top of that (docs/check.md, "When a result passes"):

    elementwise  a single elementwise op on an fp16/bf16 target: every element within a
                 few units in the last place (of the target dtype) of the float64 result
                 computed on the inputs rounded to the target dtype, or within atol; this
                 replaces the rules above, which are loose for small elements
    bias         compared with a golden, an output of enough finite elements: the mean of
                 (a - r) and the mean error in target ulps within their bounds; rounding
                 errors of a correct kernel point both ways, a bug's often do not

Metrics are computed over every leaf whose shapes agree, all leaves together, in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..core.trees import json_safe
from ..core.verdicts import Verdict
from ..suite.model import Tolerance
from .bounds import BIAS_SHIFT, ELEMENTWISE_ULPS
from .leaf_verdict import Leaf, measure_leaf
from .metrics import Metrics, OutputStats, rel_l2, sqnr_db
from .rules import Rounding
from .walk import StructureDiffers, leaf_pairs


@dataclass
class Comparison:
    verdict: Verdict
    message: str
    metrics: Metrics | None
    failing: tuple[str, ...] = ()       # paths of the output leaves that failed

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

def _fmt_idx(idx: tuple[int, ...] | None) -> str:
    return "()" if not idx else "(" + ", ".join(map(str, idx)) + (",)" if len(idx) == 1 else ")")


def _leaf_message(lf: Leaf) -> str:
    precision = lf.precision
    if not lf.bad:
        return _bias_message(lf)
    head = f"{lf.path}: {lf.bad} of {lf.numel} elements"
    first = f"first at {_fmt_idx(lf.bad_first)}"
    if lf.exact:
        return f"{head} differ (exact compare), {first}"
    if lf.elementwise_ulps is not None:
        outside = (f"more than {ELEMENTWISE_ULPS:g} {precision} ulps from the float64 result on {precision}-rounded "
                   f"inputs and outside atol={lf.atol:g} (elementwise bound)")
    else:
        outside = f"outside atol={lf.atol:g} rtol={lf.rtol:g}"
        if lf.bound:
            outside += (f" and outside the rounding bound {lf.bound:.3g} ({lf.factor:g} x the baseline's own "
                        f"float64-measured error {lf.baseline_error:.3g}{', capped' if lf.capped else ''})")
        outside += " (normwise bound)"
        if lf.torch_multiple is not None and lf.torch_factor:
            outside += (f", and its error is {lf.torch_multiple:.3g}x torch's own in {precision}, above the "
                        f"{lf.torch_factor:g}x allowed")
    nonfinite = "with NaN/Inf at different positions or signs"
    tol_bad = lf.bad - lf.nonfinite_bad
    if not lf.nonfinite_bad:
        return f"{head} {outside}, {first}"
    if not tol_bad:
        return f"{head} {nonfinite}, {first}"
    return (f"{head} mismatch: {lf.nonfinite_bad} {nonfinite} (first at "
            f"{_fmt_idx(lf.nonfinite_first)}), {tol_bad} {outside}; {first}")


def _bias_message(lf: Leaf) -> str:
    b, precision = lf.bias, lf.precision
    assert b is not None and b.broken
    n = f"over {lf.n_vals} elements"
    if b.by_shift:
        what = (f"the mean of actual - expected {n} is {b.shift:+.3g}, above the bound {b.shift_bound:.3g} "
                f"(= {BIAS_SHIFT:g} x {lf.kernel_ulps:.3g} ulps x unit roundoff of {precision} x max|expected|)")
    else:
        way = "away from zero" if b.outward else "toward +inf"
        what = (f"the elements are off by {b.drift:+.2f} {precision} ulps {way} on average {n}, above the bound "
                f"{b.drift_bound:.2f} ulps")
    return (f"{lf.path}: biased (bias bound): {what}; each element may be within its allowance, but the errors "
            "point one way, and a correct kernel's rounding does not")


def _failed_bound(lf: Leaf) -> str | None:
    if lf.nonfinite_bad:
        return "nonfinite"
    if lf.bad and not lf.as_torch:
        return "exact" if lf.exact else "elementwise" if lf.elementwise_ulps is not None else "normwise"
    return "bias" if lf.bias is not None and lf.bias.broken else None


def _metrics(leaves: list[Leaf]) -> Metrics:
    m = Metrics()
    m.numel = sum(lf.numel for lf in leaves)
    m.mismatched = sum(lf.bad for lf in leaves)
    m.mismatched_frac = m.mismatched / m.numel if m.numel else 0.0
    n = sum(lf.n_vals for lf in leaves)
    if n:
        m.mean_abs = sum(lf.sum_abs for lf in leaves) / n
        m.mse = sum(lf.sum_sq for lf in leaves) / n
    m.max_abs = max((lf.max_abs for lf in leaves), default=0.0)
    m.max_rel = max((lf.max_rel for lf in leaves), default=0.0)
    m.max_expected = max((lf.max_expected for lf in leaves), default=0.0)
    m.min_atol = max((lf.min_atol for lf in leaves), default=0.0)
    m.min_rtol = max((lf.min_rtol for lf in leaves), default=0.0)
    noise, power = sum(lf.sum_sq for lf in leaves), sum(lf.ee for lf in leaves)
    if n:
        m.mean_dev = sum(lf.sum_signed for lf in leaves) / n
    m.sqnr, m.rel_l2 = sqnr_db(noise, power), rel_l2(noise, power)
    m.outputs = [OutputStats(lf.path, lf.numel, lf.max_abs, lf.min_atol, lf.min_rtol, sqnr_db(lf.sum_sq, lf.ee),
                             lf.sum_signed / lf.n_vals if lf.n_vals else 0.0, rel_l2(lf.sum_sq, lf.ee))
                 for lf in leaves if not lf.exact]
    referenced = [lf for lf in leaves if lf.baseline_error is not None]
    if referenced:
        m.baseline_error = max(lf.baseline_error or 0.0 for lf in referenced)
        m.error_bound = max(lf.bound or 0.0 for lf in referenced)
        m.within_rounding = sum(lf.within_rounding for lf in referenced)
    dot, ee, aa = (sum(getattr(lf, k) for lf in leaves) for k in ("dot", "ee", "aa"))
    if ee == 0.0 and aa == 0.0:
        m.cosine = 1.0
    elif ee == 0.0 or aa == 0.0:
        m.cosine = 0.0
    else:
        m.cosine = max(-1.0, min(1.0, dot / (math.sqrt(ee) * math.sqrt(aa))))
    candidates = [lf for lf in leaves if lf.worst_index is not None]
    if candidates:
        worst = max(candidates, key=lambda lf: lf.worst_excess)  # first on ties
        m.worst_index, m.worst_output = worst.worst_index, worst.path
        m.worst_expected = json_safe(worst.worst_expected)
        m.worst_actual = json_safe(worst.worst_actual)
        m.allowance = worst.worst_allowance
    biased = [lf for lf in leaves if lf.bias is not None]
    if biased:
        most = max(biased, key=lambda lf: lf.bias.ratio if lf.bias is not None else 0.0)
        assert most.bias is not None
        m.bias, m.bias_bound = most.bias.shift, most.bias.shift_bound
        m.drift, m.drift_bound = most.bias.drift, most.bias.drift_bound
    elementwise = [lf.elementwise_ulps for lf in leaves if lf.elementwise_ulps is not None]
    if elementwise:
        m.elementwise_ulps = max(elementwise)
    judged = [lf for lf in leaves if lf.torch_multiple is not None]
    if judged:
        worst_leaf = max(judged, key=lambda lf: lf.torch_multiple or 0.0)
        m.torch_multiple, m.torch_factor = worst_leaf.torch_multiple, worst_leaf.torch_factor
        m.as_torch = sum(lf.bad for lf in judged if lf.bad and lf.as_torch and not lf.nonfinite_bad)
    m.failed_bound = next((b for b in map(_failed_bound, leaves) if b is not None), None)
    return m


def compare(expected: Any, actual: Any, tol: Tolerance, root: str = "out",
            rounding: Rounding | None = None) -> Comparison:
    """Compare two nested output values; see the module docstring for the rules.
    `rounding` brings the golden's float64 reference (its residuals nested like
    `expected`) and the precisions the baseline and the target compute in."""
    aux = rounding.aux if rounding is not None else (None, None, None)
    try:
        pairs = list(leaf_pairs(expected, actual, root, aux))
    except StructureDiffers as exc:
        return Comparison(Verdict.STRUCTURE_MISMATCH, f"structure differs at {exc}", None)
    if not pairs:
        return Comparison(Verdict.STRUCTURE_MISMATCH, f"{root}: nothing to compare: the output holds no "
                          f"tensor and no number ({_describe(expected)}); make the module return its "
                          "result", None)
    shape_msgs, dtype_msgs, leaves = [], [], []
    for path, e, a, res in pairs:
        if tuple(e.shape) != tuple(a.shape):
            shape_msgs.append(f"{path}: expected shape {tuple(e.shape)}, got {tuple(a.shape)}")
            continue
        if e.dtype != a.dtype:
            dtype_msgs.append(f"{path}: expected {e.dtype}, got {a.dtype}")
            if (e.dtype.is_complex != a.dtype.is_complex
                    or e.dtype.is_floating_point != a.dtype.is_floating_point):
                continue  # no meaningful numbers to compare
        leaves.append(measure_leaf(path, e, a, tol, res, rounding))
    metrics = _metrics(leaves)
    if shape_msgs:
        return Comparison(Verdict.SHAPE_MISMATCH, "shape differs at " + "; ".join(shape_msgs), metrics,
                          tuple(m.split(":")[0] for m in shape_msgs))
    if dtype_msgs:
        return Comparison(Verdict.DTYPE_MISMATCH, "dtype differs at " + "; ".join(dtype_msgs), metrics,
                          tuple(m.split(":")[0] for m in dtype_msgs))
    failing = [lf for lf in leaves if _failed_bound(lf) is not None]
    if not failing:
        return Comparison(Verdict.PASS, "", metrics)
    msg = "; ".join(_leaf_message(lf) for lf in failing[:5])
    if len(failing) > 5:
        msg += f"; and {len(failing) - 5} more outputs"
    allowed = f" (allowed {metrics.allowance:.3g})" if metrics.allowance is not None else ""
    msg += (f". Worst element at {metrics.worst_output}{list(metrics.worst_index or ())}: expected "
            f"{metrics.worst_expected}, got {metrics.worst_actual}, off by "
            f"{_off(metrics.worst_expected, metrics.worst_actual)}{allowed}; max_abs={metrics.max_abs:.3g}, "
            f"min_atol={metrics.min_atol:.3g}, min_rtol={metrics.min_rtol:.3g}"
            + (f", SQNR {metrics.sqnr:.3g} dB" if metrics.sqnr is not None else ""))
    return Comparison(Verdict.MISMATCH, msg, metrics, tuple(lf.path for lf in failing))


def _off(expected: Any, actual: Any) -> str:
    try:
        return f"{abs(float(actual) - float(expected)):.3g}"
    except (TypeError, ValueError):
        return "?"


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list, dict)) and not value:
        return f"an empty {type(value).__name__}"
    return f"a {type(value).__name__} of constants"

