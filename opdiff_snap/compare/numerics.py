"""Tolerance policy, metrics and the comparison verdict.

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

import fnmatch
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from ..backends.base import Preset
from ..core.trees import json_safe
from ..core.verdicts import Verdict
from ..suite.model import Tolerance
from .bounds import BIAS_SHIFT, ELEMENTWISE_ULPS, Bias, bias, ulps
from .metrics import Metrics
from .rules import (
    BASELINE_FACTOR,
    LeafRule,
    Rounding,
    as_f64,
    excess_over,
    leaf_rule,
)

# torch.testing.assert_close defaults.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-5, rtol=1.3e-6),
    "fp16": Tolerance(atol=1e-5, rtol=1e-3),
    "bf16": Tolerance(atol=1e-5, rtol=1.6e-2),
}
FP64_TOLERANCE = Tolerance(atol=1e-7, rtol=1e-7)

_GLOB_CHARS = set("*?[")


# ---------------------------------------------------------------- tolerance policy

def tolerance_for(case_tolerance: Any, preset: Preset, cli: Tolerance | None = None,
                  preset_override: Tolerance | None = None) -> Tolerance:
    """The tolerance to compare `preset`'s outputs with. Field by field (atol and rtol
    separately), the first source that sets the field wins:

    1. `cli` (--atol / --rtol)
    2. the test's/suite's tolerance keyed by the exact preset name
    3. ... keyed by a glob matching the preset name (the longest matching pattern first)
    4. ... keyed by the preset's precision (fp32, fp16, bf16)
    5. ... keyed "*" (the plain `{atol, rtol}` form)
    6. `preset_override`, then the preset's options `atol` / `rtol`
    7. DEFAULT_TOLERANCES[preset.precision] (torch.testing's defaults)

    `baseline_factor` (how many times the baseline's own rounding error is allowed)
    follows the same chain and defaults to BASELINE_FACTOR.

    `case_tolerance` is the `TestCase.tolerance` mapping (a TestCase is accepted too).
    """
    if hasattr(case_tolerance, "tolerance") and not isinstance(case_tolerance, Mapping):
        case_tolerance = case_tolerance.tolerance
    table: Mapping[str, Tolerance] = case_tolerance or {}
    chain: list[Tolerance | None] = [cli, table.get(preset.name)]
    globs = [k for k in table if k != "*" and k != preset.name and _GLOB_CHARS & set(k)
             and fnmatch.fnmatchcase(preset.name, k)]
    chain += [table[k] for k in sorted(globs, key=len, reverse=True)]
    chain += [table.get(preset.precision), table.get("*"), preset_override]
    opts = preset.options or {}
    chain.append(Tolerance(_opt_float(opts.get("atol")), _opt_float(opts.get("rtol")),
                           _opt_float(opts.get("baseline_factor"))))
    chain.append(DEFAULT_TOLERANCES.get(preset.precision, DEFAULT_TOLERANCES["fp32"]))

    def pick(name: str) -> float | None:
        for t in chain:
            v = _field(t, name)
            if v is not None:
                return float(v)
        return None

    factor = pick("baseline_factor")
    return Tolerance(atol=pick("atol"), rtol=pick("rtol"),
                     baseline_factor=BASELINE_FACTOR if factor is None else factor)


def _field(t: Any, name: str) -> Any:
    if t is None:
        return None
    if isinstance(t, Mapping):
        return t.get(name)
    return getattr(t, name, None)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _leaf_tolerance(tol: Tolerance, dtype: torch.dtype) -> tuple[float, float]:
    """The tolerance one output leaf is held to.

    Fields left None fall back to the leaf dtype's default. A float16 / bfloat16 leaf is
    never held tighter than its own dtype's default: an op that computes in half precision
    (fp16 inputs, even on an fp32 preset) cannot be asked for more digits than the dtype
    has. A float64 leaf under the plain fp32 default gets torch.testing's float64 values."""
    if dtype in (torch.float64, torch.complex128):
        if tol == DEFAULT_TOLERANCES["fp32"]:
            return float(FP64_TOLERANCE.atol or 0.0), float(FP64_TOLERANCE.rtol or 0.0)
        default = FP64_TOLERANCE
    elif dtype in (torch.float16, torch.bfloat16):
        default = DEFAULT_TOLERANCES["fp16" if dtype == torch.float16 else "bf16"]
        atol = max(tol.atol if tol.atol is not None else 0.0, default.atol or 0.0)
        rtol = max(tol.rtol if tol.rtol is not None else 0.0, default.rtol or 0.0)
        return float(atol), float(rtol)
    else:
        default = DEFAULT_TOLERANCES["fp32"]
    atol_set = tol.atol if tol.atol is not None else default.atol
    rtol_set = tol.rtol if tol.rtol is not None else default.rtol
    return float(atol_set or 0.0), float(rtol_set or 0.0)


# ---------------------------------------------------------------- results

@dataclass
class Comparison:
    verdict: Verdict
    message: str
    metrics: Metrics | None
    failing: tuple[str, ...] = ()       # paths of the output leaves that failed

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS


# ---------------------------------------------------------------- walking the trees

class _Structure(Exception):
    pass


def _to_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return None


def _number_kind(x: Any) -> str | None:
    if isinstance(x, (bool, np.bool_)):
        return "bool"
    if isinstance(x, (int, np.integer)):
        return "int"
    if isinstance(x, (float, np.floating)):
        return "float"
    if isinstance(x, (complex, np.complexfloating)):
        return "complex"
    return None


def _kind(x: Any) -> str:
    return type(x).__name__


def _subtree(tree: Any, key: Any) -> Any:
    """The subtree at `key` (None when the tree does not go there)."""
    try:
        if isinstance(tree, Mapping):
            return tree.get(key)
        if isinstance(tree, (tuple, list)):
            return tree[key]
    except (IndexError, TypeError):
        pass
    return None


def _child(aux: "tuple[Any, Any]", key: Any) -> "tuple[Any, Any]":
    """The (residual, elementwise reference) subtrees at `key`."""
    return _subtree(aux[0], key), _subtree(aux[1], key)


def _tensor_or_none(x: Any) -> torch.Tensor | None:
    return x if isinstance(x, torch.Tensor) else None


Leaf = tuple[str, torch.Tensor, torch.Tensor, "tuple[torch.Tensor | None, torch.Tensor | None]"]


def _pairs(e: Any, a: Any, path: str, res: "tuple[Any, Any]" = (None, None)) -> Iterator[Leaf]:
    """(path, expected, actual, (residual, elementwise reference)) per tensor/number leaf;
    raises _Structure at the first structural difference."""
    te, ta = _to_tensor(e), _to_tensor(a)
    if te is not None or ta is not None:
        if te is None or ta is None:
            raise _Structure(f"{path}: expected {'a tensor' if te is not None else _kind(e)}, "
                             f"got {'a tensor' if ta is not None else _kind(a)}")
        yield path, te, ta, (_tensor_or_none(res[0]), _tensor_or_none(res[1]))
        return
    if isinstance(e, (tuple, list)) or isinstance(a, (tuple, list)):
        if not (isinstance(e, (tuple, list)) and isinstance(a, (tuple, list))):
            raise _Structure(f"{path}: expected {_kind(e)}, got {_kind(a)}")
        if len(e) != len(a):
            raise _Structure(f"{path}: expected {len(e)} elements, got {len(a)}")
        for i, (ei, ai) in enumerate(zip(e, a)):
            yield from _pairs(ei, ai, f"{path}[{i}]", _child(res, i))
        return
    if isinstance(e, Mapping) or isinstance(a, Mapping):
        if not (isinstance(e, Mapping) and isinstance(a, Mapping)):
            raise _Structure(f"{path}: expected {_kind(e)}, got {_kind(a)}")
        missing = [k for k in e if k not in a]
        extra = [k for k in a if k not in e]
        if missing or extra:
            parts = ([f"missing keys {missing!r}"] if missing else []) + \
                    ([f"unexpected keys {extra!r}"] if extra else [])
            raise _Structure(f"{path}: {', '.join(parts)}")
        for k in e:
            yield from _pairs(e[k], a[k], f"{path}[{k!r}]", _child(res, k))
        return
    ke, ka = _number_kind(e), _number_kind(a)
    if ke is not None and ka is not None:
        if (ke == "bool") != (ka == "bool") or (ke == "complex") != (ka == "complex"):
            raise _Structure(f"{path}: expected {_kind(e)} {e!r}, got {_kind(a)} {a!r}")
        if ke == ka == "bool":
            yield path, torch.tensor(bool(e)), torch.tensor(bool(a)), (None, None)
        elif ke == ka == "int":
            yield path, torch.tensor(int(e), dtype=torch.int64), torch.tensor(int(a), dtype=torch.int64), \
                (None, None)
        elif ke == "complex":
            yield path, torch.tensor(complex(e), dtype=torch.complex128), \
                torch.tensor(complex(a), dtype=torch.complex128), (None, None)
        else:  # float vs float, or int vs float: numeric compare under the tolerance. A Python
            # float leaves a backend as a float32 tensor (torch's default dtype), so it is held
            # to the float32 rule, not to float64's tighter one.
            wide = any(math.isfinite(float(v)) and abs(float(v)) > 3.0e38 for v in (e, a))
            dtype = torch.float64 if wide else torch.float32
            yield path, torch.tensor(float(e), dtype=dtype), torch.tensor(float(a), dtype=dtype), (None, None)
        return
    if type(e) is not type(a) or e != a:
        raise _Structure(f"{path}: expected {e!r}, got {a!r}")


# ---------------------------------------------------------------- one leaf

@dataclass
class _Leaf:
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


def _index(flat: int, shape: tuple[int, ...], complex_: bool) -> tuple[int, ...]:
    idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    return idx[:-1] if complex_ else idx


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.einsum("i,i->", x, y))   # single-threaded: BLAS threads suffer on busy boxes


def _first(mask: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    return _index(int(np.argmax(mask)), shape, False)


def _leaf(path: str, e: torch.Tensor, a: torch.Tensor, tol: Tolerance,
          aux: "tuple[torch.Tensor | None, torch.Tensor | None]" = (None, None),
          rounding: Rounding | None = None) -> _Leaf:
    """Everything about one leaf pair of equal shape, vectorised in float64 numpy."""
    e, a = (t.detach().cpu().resolve_conj().resolve_neg() for t in (e, a))
    exact = not (e.dtype.is_floating_point or e.dtype.is_complex)
    atol, rtol = (0.0, 0.0) if exact else _leaf_tolerance(tol, e.dtype)
    out = _Leaf(path, e.numel(), exact=exact, atol=atol, rtol=rtol)
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
    aux = (rounding.residuals, rounding.elementwise) if rounding is not None else (None, None)
    rules: list[LeafRule | None] = []
    for _, e, _, leaf_aux in _pairs(expected, expected, "out", aux):
        if id(e) not in wanted:
            continue
        e = e.detach().cpu().resolve_conj().resolve_neg()
        if not (e.dtype.is_floating_point or e.dtype.is_complex) or e.numel() == 0:
            rules.append(None)
            continue
        atol, rtol = _leaf_tolerance(tol, e.dtype)
        flat = torch.view_as_real(e.to(torch.complex128)) if e.dtype.is_complex else e
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            rules.append(leaf_rule(e, as_f64(flat), atol, rtol, tol, leaf_aux, rounding, e.dtype.is_complex))
    return rules


def _apply_rule(out: _Leaf, rule: LeafRule, af: np.ndarray, row: int) -> np.ndarray:
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
    if rule.u is not None and rule.bias_centre is not None:
        usable = np.isfinite(af) & np.isfinite(rule.bias_centre)
        out.bias = bias(af[usable], rule.bias_centre[usable], rule.u, rule.tiny, rule.atol, rule.kernel_ulps,
                        row)
        out.kernel_ulps = rule.kernel_ulps
    return excess


def _leaf_values(out: _Leaf, e: torch.Tensor, a: torch.Tensor, ef: np.ndarray, af: np.ndarray,
                 shape: tuple[int, ...], is_complex: bool, rule: LeafRule | None = None) -> _Leaf:
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
        bad = excess > 0
        nonfinite_bad = None
        if finite is not None:  # slow path: NaN/Inf present somewhere
            en, an = np.isnan(ef), np.isnan(af)
            # NaN must face NaN; otherwise a non-finite value must be equal (same-signed Inf).
            nonfinite_bad = (en != an) | (~finite & ~en & ~an & (ef != af))
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
        if r is not None:
            out.min_atol = _passing_atol(max(0.0, float((d - r).max())), d, r)
    return out


def _passing_atol(m: float, d: np.ndarray, r: np.ndarray) -> float:
    """Nudge m up by ulps until `d <= m + r` holds everywhere in float64 arithmetic
    (the subtraction that produced m can round down); max(d) always passes."""
    for _ in range(16):
        if bool((d <= m + r).all()):
            return m
        m = math.nextafter(m, math.inf)
    return float(d.max())


# ---------------------------------------------------------------- compare

def _fmt_idx(idx: tuple[int, ...] | None) -> str:
    return "()" if not idx else "(" + ", ".join(map(str, idx)) + (",)" if len(idx) == 1 else ")")


def _leaf_message(lf: _Leaf) -> str:
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
    nonfinite = "with NaN/Inf at different positions or signs"
    tol_bad = lf.bad - lf.nonfinite_bad
    if not lf.nonfinite_bad:
        return f"{head} {outside}, {first}"
    if not tol_bad:
        return f"{head} {nonfinite}, {first}"
    return (f"{head} mismatch: {lf.nonfinite_bad} {nonfinite} (first at "
            f"{_fmt_idx(lf.nonfinite_first)}), {tol_bad} {outside}; {first}")


def _bias_message(lf: _Leaf) -> str:
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


def _failed_bound(lf: _Leaf) -> str | None:
    if lf.nonfinite_bad:
        return "nonfinite"
    if lf.bad:
        return "exact" if lf.exact else "elementwise" if lf.elementwise_ulps is not None else "normwise"
    return "bias" if lf.bias is not None and lf.bias.broken else None


def _metrics(leaves: list[_Leaf]) -> Metrics:
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
    m.failed_bound = next((b for b in map(_failed_bound, leaves) if b is not None), None)
    return m


def compare(expected: Any, actual: Any, tol: Tolerance, root: str = "out",
            rounding: Rounding | None = None) -> Comparison:
    """Compare two nested output values; see the module docstring for the rules.
    `rounding` brings the golden's float64 reference (its residuals nested like
    `expected`) and the precisions the baseline and the target compute in."""
    aux = (rounding.residuals, rounding.elementwise) if rounding is not None else (None, None)
    try:
        pairs = list(_pairs(expected, actual, root, aux))
    except _Structure as exc:
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
        leaves.append(_leaf(path, e, a, tol, res, rounding))
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
            f"min_atol={metrics.min_atol:.3g}")
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


# ---------------------------------------------------------------- gradients

def grad_tolerance(tol: Tolerance, expected: torch.Tensor) -> Tolerance:
    """The output tolerance widened for gradients: a gradient carries the forward's
    rounding and the backward's (so 2 x rtol), and its entries are sums whose error
    scales with the tensor's largest entry rather than with each small entry, so atol
    is at least 2 x rtol x max|g|. Measured on torch_cpu_bf16 (tests/helpers_cause):
    max error / max|g| stayed within 0.3%-1.5% over 5 seeds, against 3.2% allowed."""
    scale = float(expected.abs().max()) if expected.numel() and expected.is_floating_point() else 0.0
    rtol = 2 * (tol.rtol or 0.0)
    return Tolerance(atol=max(tol.atol or 0.0, rtol * scale), rtol=rtol, baseline_factor=0.0)


def compare_grads(expected: Mapping[str, Mapping[str, torch.Tensor]],
                  actual: Mapping[str, Mapping[str, torch.Tensor]], tol: Tolerance) -> Comparison:
    """Recorded against recomputed gradients, tensor by tensor with grad_tolerance: the
    Comparison of the first failing tensor (of the first one when all pass); its message
    and metrics.worst_output name it, e.g. grad[fc.bias]. A recorded gradient with no
    counterpart (the module changed) is a STRUCTURE_MISMATCH."""
    first: Comparison | None = None
    for group, named in expected.items():
        for name, g in named.items():
            a = actual.get(group, {}).get(name)
            if a is None:
                return Comparison(Verdict.STRUCTURE_MISMATCH, f"grad[{name}]: recorded, but the module has no "
                                  "such input or parameter now; re-record the golden", None, (f"grad[{name}]",))
            result = compare(g, a.to(g.dtype), grad_tolerance(tol, g), root=f"grad[{name}]")
            if first is None or (first.passed and not result.passed):
                first = result
    return first if first is not None else Comparison(Verdict.PASS, "", Metrics())
