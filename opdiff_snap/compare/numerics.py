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
from .metrics import Metrics

# torch.testing.assert_close defaults.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-5, rtol=1.3e-6),
    "fp16": Tolerance(atol=1e-5, rtol=1e-3),
    "bf16": Tolerance(atol=1e-5, rtol=1.6e-2),
}
FP64_TOLERANCE = Tolerance(atol=1e-7, rtol=1e-7)

# How many times the baseline's own measured rounding error a target may differ by.
BASELINE_FACTOR = 4.0
# Unit roundoff of the precisions outputs are computed in.
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
# The rounding allowance never exceeds this fraction of an output's largest magnitude:
# an eighth (fp32) and a quarter (fp16) of the 2^-7 relative error of a wrong kernel, so
# such a kernel stays a MISMATCH. bf16's own default rtol (1.6e-2) is already above 2^-7.
ALLOWANCE_CAP = {"fp64": 2.0**-40, "fp32": 2.0**-10, "fp16": 2.0**-9, "bf16": 2.0**-6}

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


@dataclass(frozen=True)
class Rounding:
    """What a golden knows about its own rounding error, and the precisions involved.

    `residuals` is nested like the golden's outputs: for each floating tensor leaf the
    float64 reference minus the golden value (`None` where there is none)."""

    residuals: Any
    baseline_precision: str = "fp32"
    target_precision: str = "fp32"


def unit_roundoff(precision: str, dtype: torch.dtype) -> float:
    """The unit roundoff an output of `dtype` is computed with at `precision` (the coarser)."""
    leaf = {torch.float64: "fp64", torch.complex128: "fp64", torch.float16: "fp16",
            torch.bfloat16: "bf16"}.get(dtype, "fp32")
    return max(UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["fp32"]), UNIT_ROUNDOFF[leaf])


def _precision_of(u: float) -> str:
    return next(name for name, value in UNIT_ROUNDOFF.items() if value == u)


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


def _child(residuals: Any, key: Any) -> Any:
    """The residual subtree at `key` (None when the residual tree does not go there)."""
    try:
        if isinstance(residuals, Mapping):
            return residuals.get(key)
        if isinstance(residuals, (tuple, list)):
            return residuals[key]
    except (IndexError, TypeError):
        pass
    return None


Leaf = tuple[str, torch.Tensor, torch.Tensor, "torch.Tensor | None"]


def _pairs(e: Any, a: Any, path: str, res: Any = None) -> Iterator[Leaf]:
    """(path, expected, actual, residual) per tensor/number leaf; raises _Structure at
    the first structural difference."""
    te, ta = _to_tensor(e), _to_tensor(a)
    if te is not None or ta is not None:
        if te is None or ta is None:
            raise _Structure(f"{path}: expected {'a tensor' if te is not None else _kind(e)}, "
                             f"got {'a tensor' if ta is not None else _kind(a)}")
        yield path, te, ta, res if isinstance(res, torch.Tensor) else None
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
            yield path, torch.tensor(bool(e)), torch.tensor(bool(a)), None
        elif ke == ka == "int":
            yield path, torch.tensor(int(e), dtype=torch.int64), torch.tensor(int(a), dtype=torch.int64), None
        elif ke == "complex":
            yield path, torch.tensor(complex(e), dtype=torch.complex128), \
                torch.tensor(complex(a), dtype=torch.complex128), None
        else:  # float vs float, or int vs float: numeric compare under the tolerance. A Python
            # float leaves a backend as a float32 tensor (torch's default dtype), so it is held
            # to the float32 rule, not to float64's tighter one.
            wide = any(math.isfinite(float(v)) and abs(float(v)) > 3.0e38 for v in (e, a))
            dtype = torch.float64 if wide else torch.float32
            yield path, torch.tensor(float(e), dtype=dtype), torch.tensor(float(a), dtype=dtype), None
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


@dataclass(frozen=True)
class _Allowance:
    """How one leaf uses its float64 reference."""

    residual: np.ndarray        # flat float64, aligned with the leaf's flat values
    factor: float
    scale: float                # u_target / u_baseline
    cap: float                  # fraction of the leaf's largest magnitude


def _index(flat: int, shape: tuple[int, ...], complex_: bool) -> tuple[int, ...]:
    idx = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    return idx[:-1] if complex_ else idx


def _as_f64(t: torch.Tensor) -> np.ndarray:
    # numpy's casts are far faster than torch's; numpy has no bfloat16, so widen that first
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.reshape(-1).numpy().astype(np.float64)


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.einsum("i,i->", x, y))   # single-threaded: BLAS threads suffer on busy boxes


def _first(mask: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    return _index(int(np.argmax(mask)), shape, False)


def _allowance(e: torch.Tensor, res: torch.Tensor | None, tol: Tolerance,
               rounding: Rounding | None) -> _Allowance | None:
    if res is None or rounding is None or tuple(res.shape) != tuple(e.shape):
        return None
    factor = BASELINE_FACTOR if tol.baseline_factor is None else float(tol.baseline_factor)
    if factor <= 0 or not (e.dtype.is_floating_point or e.dtype.is_complex):
        return None
    r = res.detach().cpu()
    if r.is_complex():
        r = torch.view_as_real(r.to(torch.complex128))
    u_t = unit_roundoff(rounding.target_precision, e.dtype)
    u_b = unit_roundoff(rounding.baseline_precision, e.dtype)
    return _Allowance(_as_f64(r), factor, u_t / u_b, ALLOWANCE_CAP[_precision_of(u_t)])


def _leaf(path: str, e: torch.Tensor, a: torch.Tensor, tol: Tolerance,
          res: torch.Tensor | None = None, rounding: Rounding | None = None) -> _Leaf:
    """Everything about one leaf pair of equal shape, vectorised in float64 numpy."""
    e, a = (t.detach().cpu().resolve_conj().resolve_neg() for t in (e, a))
    exact = not (e.dtype.is_floating_point or e.dtype.is_complex)
    atol, rtol = (0.0, 0.0) if exact else _leaf_tolerance(tol, e.dtype)
    out = _Leaf(path, e.numel(), exact=exact, atol=atol, rtol=rtol)
    if e.numel() == 0:
        return out
    allowance = None if exact else _allowance(e, res, tol, rounding)
    is_complex = e.dtype.is_complex or a.dtype.is_complex
    if is_complex:  # real and imaginary parts as a trailing dimension of 2
        e, a = torch.view_as_real(e.to(torch.complex128)), torch.view_as_real(a.to(torch.complex128))
    shape = tuple(e.shape)
    ef, af = _as_f64(e), _as_f64(a)
    if allowance is not None and allowance.residual.size != ef.size:
        allowance = None
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf are dealt with below
        return _leaf_values(out, e, a, ef, af, shape, is_complex, allowance)


def _rounding_excess(out: _Leaf, ef: np.ndarray, af: np.ndarray, d: np.ndarray, excess: np.ndarray,
                     al: _Allowance) -> np.ndarray:
    """The excess over the best of the three rules (configured tolerance, rounding
    allowance, the float64 reference); records the allowance used on `out`."""
    ref = ef + np.where(np.isfinite(al.residual), al.residual, 0.0)
    usable = np.isfinite(ef) & np.isfinite(ref)
    if not usable.any():
        return excess
    error = float(np.abs(ref - ef)[usable].max())
    magnitude = float(np.abs(ef)[usable].max())
    scaled = al.factor * error * al.scale
    bound = min(scaled, al.cap * magnitude)
    out.baseline_error, out.bound, out.factor, out.capped = error, bound, al.factor, bound < scaled
    by_bound = d - bound
    by_reference = np.abs(af - ref) - (out.atol + out.rtol * np.abs(ref))
    best = np.minimum(excess, np.minimum(by_bound, by_reference))
    out.within_rounding = int(np.count_nonzero((excess > 0) & (best <= 0)))
    return best


def _leaf_values(out: _Leaf, e: torch.Tensor, a: torch.Tensor, ef: np.ndarray, af: np.ndarray,
                 shape: tuple[int, ...], is_complex: bool, allowance: _Allowance | None = None) -> _Leaf:
    exact, atol, rtol = out.exact, out.atol, out.rtol
    el_shape = shape[:-1] if is_complex else shape
    d = np.abs(af - ef)
    abs_e = np.abs(ef)
    if exact:
        bad = (e.reshape(-1) != a.reshape(-1)).numpy()
        finite, nonfinite_bad, excess, r = None, None, d, None
    else:
        r = rtol * abs_e
        finite = None if np.isfinite(d).all() else (np.isfinite(ef) & np.isfinite(af))
        excess = d - (atol + r)
        if allowance is not None:
            excess = _rounding_excess(out, ef, af, d, excess, allowance)
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

    if finite is not None:
        d, ef, af, abs_e = d[finite], ef[finite], af[finite], abs_e[finite]
        r = r[finite] if r is not None else None
    out.n_vals = int(d.size)
    if d.size:
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
    head = f"{lf.path}: {lf.bad} of {lf.numel} elements"
    first = f"first at {_fmt_idx(lf.bad_first)}"
    if lf.exact:
        return f"{head} differ (exact compare), {first}"
    outside = f"outside atol={lf.atol:g} rtol={lf.rtol:g}"
    if lf.bound:
        outside += (f" and outside the rounding bound {lf.bound:.3g} ({lf.factor:g} x the baseline's own "
                    f"float64-measured error {lf.baseline_error:.3g}{', capped' if lf.capped else ''})")
    nonfinite = "with NaN/Inf at different positions or signs"
    tol_bad = lf.bad - lf.nonfinite_bad
    if not lf.nonfinite_bad:
        return f"{head} {outside}, {first}"
    if not tol_bad:
        return f"{head} {nonfinite}, {first}"
    return (f"{head} mismatch: {lf.nonfinite_bad} {nonfinite} (first at "
            f"{_fmt_idx(lf.nonfinite_first)}), {tol_bad} {outside}; {first}")


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
    return m


def compare(expected: Any, actual: Any, tol: Tolerance, root: str = "out",
            rounding: Rounding | None = None) -> Comparison:
    """Compare two nested output values; see the module docstring for the rules.
    `rounding` brings the golden's float64 reference (its residuals nested like
    `expected`) and the precisions the baseline and the target compute in."""
    residuals = rounding.residuals if rounding is not None else None
    try:
        pairs = list(_pairs(expected, actual, root, residuals))
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
    failing = [lf for lf in leaves if lf.bad]
    if not failing:
        return Comparison(Verdict.PASS, "", metrics)
    msg = "; ".join(_leaf_message(lf) for lf in failing[:5])
    if len(failing) > 5:
        msg += f"; and {len(failing) - 5} more outputs"
    msg += (f". Worst at {metrics.worst_output}{list(metrics.worst_index or ())}: expected "
            f"{metrics.worst_expected}, got {metrics.worst_actual}; max_abs={metrics.max_abs:.3g}, "
            f"min_atol={metrics.min_atol:.3g}")
    return Comparison(Verdict.MISMATCH, msg, metrics, tuple(lf.path for lf in failing))


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
