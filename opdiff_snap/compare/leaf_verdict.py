"""One output leaf: its rule applied element by element, and everything compare() keeps of
it (mismatches, the worst element, the sums its metrics are made of), in float64 numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..suite.model import Tolerance
from .bounds import Bias, bias, ulps
from .rules import LeafRule, Rounding, as_f64, excess_over, leaf_rule, overflowed
from .tolerance import leaf_tolerance
from .walk import leaf_pairs


@dataclass
class Leaf:
    """What one leaf pair of equal shape came to: its mismatches, worst element, the
    bounds it was held to, and the sums its share of the metrics is made of."""

    path: str
    numel: int
    n_vals: int = 0            # finite-on-both-sides components
    sum_abs: float = 0.0
    sum_sq: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    dot: float = 0.0
    ee: float = 0.0
    aa: float = 0.0
    bad: int = 0               # mismatched elements
    bad_first: tuple[int, ...] | None = None
    nonfinite_bad: int = 0
    nonfinite_first: tuple[int, ...] | None = None
    worst_excess: float = -math.inf
    worst_index: tuple[int, ...] | None = None
    worst_expected: float | None = None
    worst_actual: float | None = None
    min_atol: float = 0.0
    min_rtol: float = 0.0      # the smallest rtol with which it passes at its atol
    sum_signed: float = 0.0    # of actual - expected, over the finite-on-both-sides components
    exact: bool = False
    atol: float = 0.0
    rtol: float = 0.0
    baseline_error: float | None = None    # max |golden - reference|, with a reference
    bound: float | None = None             # the rounding allowance used
    factor: float = 0.0
    capped: bool = False
    within_rounding: int = 0
    worst_allowance: float | None = None
    elementwise_ulps: float | None = None  # with an elementwise reference: the largest error in ulps
    bias: Bias | None = None
    precision: str = "fp32"                # the precision the target computes this leaf in
    max_expected: float = 0.0
    kernel_ulps: float = 1.0               # the unit of its bias bounds
    # a composite output on fp16/bf16: its error as a multiple of torch eager's own at that
    # precision (compare.rules.TorchError), and the multiple allowed
    torch_multiple: float | None = None
    torch_factor: float | None = None

    @property
    def as_torch(self) -> bool:
        """Whether its elements outside every band are forgiven: its error is within the
        allowed multiple of torch's own at the target's precision."""
        return self.torch_multiple is not None and self.torch_factor is not None \
            and self.torch_multiple <= self.torch_factor


def _index(flat: int, shape: tuple[int, ...], complex_: bool) -> tuple[int, ...]:
    idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    return idx[:-1] if complex_ else idx


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.einsum("i,i->", x, y))   # single-threaded: BLAS threads suffer on busy boxes


def _first(mask: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    return _index(int(np.argmax(mask)), shape, False)


def measure_leaf(path: str, e: torch.Tensor, a: torch.Tensor, tol: Tolerance,
          aux: "tuple[torch.Tensor | None, ...]" = (None, None, None),
          rounding: Rounding | None = None) -> Leaf:
    """Everything about one leaf pair of equal shape, vectorised in float64 numpy."""
    e, a = (t.detach().cpu().resolve_conj().resolve_neg() for t in (e, a))
    exact = not (e.dtype.is_floating_point or e.dtype.is_complex)
    atol, rtol = (0.0, 0.0) if exact else leaf_tolerance(tol, e.dtype)
    out = Leaf(path, e.numel(), exact=exact, atol=atol, rtol=rtol)
    if e.numel() == 0:
        return out
    is_complex = e.dtype.is_complex or a.dtype.is_complex
    e0 = e
    if is_complex:  # real and imaginary parts as a trailing dimension of 2
        e, a = torch.view_as_real(e.to(torch.complex128)), torch.view_as_real(a.to(torch.complex128))
    shape = tuple(e.shape)
    ef, af = as_f64(e), as_f64(a)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # NaN/Inf are dealt with below
        rule = None if exact else leaf_rule(e0, ef, atol, rtol, tol, aux, rounding, is_complex)
        return _leaf_values(out, e, a, ef, af, shape, is_complex, rule)


def leaf_rules(expected: Any, tol: Tolerance, rounding: Rounding | None) -> list[LeafRule | None]:
    """The rule of every tensor leaf of `expected`, in trees.flatten order, as compare()
    applies them (None: an integer or bool leaf, compared exactly)."""
    from ..core.trees import flatten

    _, tensors = flatten(expected)
    wanted = {id(t) for t in tensors}
    aux = rounding.aux if rounding is not None else (None, None, None)
    rules: list[LeafRule | None] = []
    for _, e, _, leaf_aux in leaf_pairs(expected, expected, "out", aux):
        if id(e) not in wanted:
            continue
        e = e.detach().cpu().resolve_conj().resolve_neg()
        if not (e.dtype.is_floating_point or e.dtype.is_complex) or e.numel() == 0:
            rules.append(None)
            continue
        atol, rtol = leaf_tolerance(tol, e.dtype)
        flat = torch.view_as_real(e.to(torch.complex128)) if e.dtype.is_complex else e
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            rules.append(leaf_rule(e, as_f64(flat), atol, rtol, tol, leaf_aux, rounding, e.dtype.is_complex))
    return rules


def _apply_rule(out: Leaf, rule: LeafRule, af: np.ndarray, row: int) -> np.ndarray:
    """The excess of every element over `rule`; records on `out` what the message and the
    metrics say of it."""
    excess, first = excess_over(rule, af)
    out.precision = rule.precision
    if rule.kind == "elementwise":
        exact_answer = rule.bands[0].centre
        in_ulps = np.abs(af - exact_answer) / ulps(exact_answer, rule.u or 0.0, rule.tiny)
        finite = np.isfinite(in_ulps)
        out.elementwise_ulps = float(in_ulps[finite].max()) if finite.any() else None
    elif rule.bound is not None:
        out.baseline_error, out.bound, out.factor, out.capped = rule.baseline_error, rule.bound, rule.factor, \
            rule.capped
        out.within_rounding = int(np.count_nonzero((first > 0) & (excess <= 0)))
    if rule.torch is not None:
        out.torch_multiple, out.torch_factor = rule.torch.multiple(af), rule.torch.factor
    if rule.u is not None and rule.bias_centre is not None:
        usable = np.isfinite(af) & np.isfinite(rule.bias_centre)
        out.bias = bias(af[usable], rule.bias_centre[usable], rule.u, rule.tiny, rule.atol, rule.kernel_ulps,
                        row)
        out.kernel_ulps = rule.kernel_ulps
    return excess


def _leaf_values(out: Leaf, e: torch.Tensor, a: torch.Tensor, ef: np.ndarray, af: np.ndarray,
                 shape: tuple[int, ...], is_complex: bool, rule: LeafRule | None = None) -> Leaf:
    exact, rtol = out.exact, out.rtol
    el_shape = shape[:-1] if is_complex else shape
    d = np.abs(af - ef)
    abs_e = np.abs(ef)
    if exact:
        bad = (e.reshape(-1) != a.reshape(-1)).numpy()
        finite, nonfinite_bad, excess, r = None, None, d, None
    else:
        r = rtol * abs_e
        finite = None if np.isfinite(d).all() else (np.isfinite(ef) & np.isfinite(af))
        assert rule is not None, "a floating leaf has its rule"
        excess = _apply_rule(out, rule, af, shape[-1] if shape else 1)
        over = overflowed(rule, af)    # the answer overflows the target's precision
        if over.any():
            excess = np.where(over, np.minimum(excess, 0.0), excess)
        bad = excess > 0
        nonfinite_bad = None
        if finite is not None:  # slow path: NaN/Inf present somewhere
            en, an = np.isnan(ef), np.isnan(af)
            # NaN must face NaN; otherwise a non-finite value must be equal (same-signed Inf).
            nonfinite_bad = (en != an) | (~finite & ~en & ~an & (ef != af))
            nonfinite_bad &= ~over
            bad = nonfinite_bad | (finite & bad)
            excess = np.where(finite, excess, -np.inf)
            excess[nonfinite_bad] = np.inf

    bad_el = bad.reshape(-1, 2).any(axis=1) if is_complex else bad
    out.bad = int(np.count_nonzero(bad_el))
    if out.bad:
        out.bad_first = _first(bad_el, el_shape)
    if nonfinite_bad is not None:
        nf_el = nonfinite_bad.reshape(-1, 2).any(axis=1) if is_complex else nonfinite_bad
        out.nonfinite_bad = int(np.count_nonzero(nf_el))
        if out.nonfinite_bad:
            out.nonfinite_first = _first(nf_el, el_shape)

    w = int(np.argmax(excess))
    out.worst_excess = float(excess[w])
    out.worst_index = _index(w, shape, is_complex)
    out.worst_expected, out.worst_actual = float(ef[w]), float(af[w])
    if rule is not None and math.isfinite(out.worst_excess):
        out.worst_allowance = float(abs(af[w] - rule.bands[0].centre[w]) - excess[w])

    if finite is not None:
        d, ef, af, abs_e = d[finite], ef[finite], af[finite], abs_e[finite]
        r = r[finite] if r is not None else None
    out.n_vals = int(d.size)
    if d.size:
        out.max_expected = float(abs_e.max())
        out.sum_abs = float(d.sum())
        out.sum_sq = _dot(d, d)
        out.max_abs = float(d.max())
        out.max_rel = float((d / np.where(abs_e > 0, abs_e, np.inf)).max())  # e == 0 left out
        out.dot, out.ee, out.aa = _dot(ef, af), _dot(ef, ef), _dot(af, af)
        out.sum_signed = float((af.astype(np.float64) - ef.astype(np.float64)).sum())
        if r is not None:
            out.min_atol = _passing_atol(max(0.0, float((d - r).max())), d, r)
            out.min_rtol = _passing_rtol(d, abs_e, out.atol)
    return out


def _passing_rtol(d: np.ndarray, abs_e: np.ndarray, atol: float) -> float:
    """The smallest rtol with which `d <= atol + rtol * |e|` holds everywhere (inf where an
    element beyond atol faces an expected 0)."""
    over = d > atol
    if not over.any():
        return 0.0
    e = abs_e[over]
    if not (e > 0).all():
        return math.inf
    need = (d[over] - atol) / e
    m = float(need.max())
    for _ in range(16):   # the division can round down: nudge up until it holds in float64
        if bool((d <= atol + m * abs_e).all()):
            return m
        m = math.nextafter(m, math.inf)
    return m


def _passing_atol(m: float, d: np.ndarray, r: np.ndarray) -> float:
    """Nudge m up by ulps until `d <= m + r` holds everywhere in float64 arithmetic
    (the subtraction that produced m can round down); max(d) always passes."""
    for _ in range(16):
        if bool((d <= m + r).all()):
            return m
        m = math.nextafter(m, math.inf)
    return float(d.max())


