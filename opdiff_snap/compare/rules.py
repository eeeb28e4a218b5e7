"""What one floating output is held to: the bands an element may lie in (the configured
tolerance, the baseline's rounding allowance, the float64 reference; or for a single
elementwise op on fp16/bf16 a few ulps of its exact answer), and the unit of its bias bound.

A `LeafRule` is computed from the golden's side alone, so compare/numerics.py judges with
it and a repro script carries it as data (`LeafRule.to_script`) and judges the same way.
docs/check.md, "When a result passes", says why each rule is what it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..suite.model import Tolerance
from .bounds import ELEMENTWISE_ULPS, KERNEL_ULPS, elementwise_allowance

# How many times the baseline's own measured rounding error a target may differ by.
BASELINE_FACTOR = 4.0
# Unit roundoff of the precisions outputs are computed in.
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
# The rounding allowance never exceeds this fraction of an output's largest magnitude:
# an eighth (fp32) and a quarter (fp16) of the 2^-7 relative error of a wrong kernel, so
# such a kernel stays a MISMATCH. bf16's own default rtol (1.6e-2) is already above 2^-7.
ALLOWANCE_CAP = {"fp64": 2.0**-40, "fp32": 2.0**-10, "fp16": 2.0**-9, "bf16": 2.0**-6}
# The magnitude from which rounding to nearest gives inf in a precision: its largest finite
# value plus half an ulp there. An answer past it is rightly inf on a target computing in
# that precision.
OVERFLOW = {"fp16": 65520.0, "bf16": (2 - 2.0**-8) * 2.0**127}
# The largest finite value per precision: what a saturating target (or an op defined by its
# dtype's range, such as nan_to_num) answers for such an answer instead of inf.
LARGEST = {"fp16": 65504.0, "bf16": (2 - 2.0**-7) * 2.0**127}
# Smallest normal number per precision (compare/bounds.py).
TINY = {"fp64": 2.0**-1022, "fp32": 2.0**-126, "fp16": 2.0**-14, "bf16": 2.0**-126}
# A composite output on an fp16/bf16 target may be off the float64 reference by this many
# times what torch eager at that precision is off by (its RMS error and its largest error),
# each plus TORCH_FLOOR unit roundoffs of the output's largest magnitude (where torch is
# exact). docs/check.md, "Composite tests on fp16 and bf16", gives the measurement.
PRECISION_FACTOR = {"fp16": 1.75, "bf16": 1.75}
TORCH_FLOOR = 1.0


@dataclass(frozen=True)
class Rounding:
    """What a golden knows about its own rounding error, and the precisions involved.

    `residuals` is nested like the golden's outputs: for each floating tensor leaf the
    float64 reference minus the golden value (`None` where there is none). `elementwise`,
    nested the same way, holds the float64 result of a single elementwise op on the inputs
    rounded to the target's dtype (None: the test is not one, or the target is fp32).
    `control`, nested the same way, holds torch eager's outputs at the target's precision
    on the same inputs and weights (the precision control; None: there is none)."""

    residuals: Any
    baseline_precision: str = "fp32"
    target_precision: str = "fp32"
    elementwise: Any = None
    control: Any = None

    @property
    def aux(self) -> tuple[Any, Any, Any]:
        """The trees nested like the outputs, in the order compare.walk hands out their leaves."""
        return self.residuals, self.elementwise, self.control


def unit_roundoff(precision: str, dtype: torch.dtype) -> float:
    """The unit roundoff an output of `dtype` is computed with at `precision` (the coarser)."""
    leaf = {torch.float64: "fp64", torch.complex128: "fp64", torch.float16: "fp16",
            torch.bfloat16: "bf16"}.get(dtype, "fp32")
    return max(UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["fp32"]), UNIT_ROUNDOFF[leaf])


def precision_of(u: float) -> str:
    return next(name for name, value in UNIT_ROUNDOFF.items() if value == u)


@dataclass
class Band:
    """One way an element passes: |actual - centre| <= width (flat float64 arrays)."""

    centre: np.ndarray
    width: np.ndarray


@dataclass
class TorchError:
    """How far torch eager at the target's precision lies from the float64 reference on one
    output (RMS and largest error over the elements finite in both), and what a target may
    reach: `factor` times each, plus `floor`. The target's own errors are measured against
    the same reference (`reference`, flat float64)."""

    reference: np.ndarray
    rms: float
    largest: float
    factor: float
    floor: float

    def multiple(self, actual: np.ndarray) -> float | None:
        """The target's error as a multiple of torch's: the larger of the RMS and the
        largest-error ratios, each against torch's error plus floor / factor (so that the
        target passes exactly when the multiple is at most `factor`). None: no element to
        measure."""
        usable = np.isfinite(actual) & np.isfinite(self.reference)
        if not usable.any():
            return None
        diff = np.abs(actual[usable] - self.reference[usable])
        rms, largest = float(np.sqrt(np.mean(diff * diff))), float(diff.max())
        slack = self.floor / self.factor if self.factor > 0 else self.floor
        ratios = [value / (own + slack) if own + slack > 0 else (0.0 if value == 0 else math.inf)
                  for value, own in ((rms, self.rms), (largest, self.largest))]
        return max(ratios)

    def to_script(self) -> dict[str, Any]:
        return {"rms": self.rms, "largest": self.largest, "factor": self.factor, "floor": self.floor}


@dataclass
class LeafRule:
    """What one floating output leaf is held to, from the golden's side alone: the bands
    an element may lie in (it passes when it lies in any), and what the bias bound measures
    against. The first band is the configured tolerance (or, elementwise, the ulps bound).
    compare() and the repro scripts judge with exactly these numbers."""

    kind: str                           # "normwise" or "elementwise"
    bands: list[Band]
    atol: float
    rtol: float
    u: float | None = None              # the target's unit roundoff (None: no bias bound)
    tiny: float = 0.0
    precision: str = "fp32"
    bias_centre: np.ndarray | None = None
    baseline_error: float | None = None
    bound: float | None = None
    factor: float = 0.0
    capped: bool = False
    torch: TorchError | None = None     # a composite output on fp16/bf16: torch's own error there

    @property
    def kernel_ulps(self) -> float:
        """The unit of the bias bounds, in target ulps (compare/bounds.py, KERNEL_ULPS)."""
        return KERNEL_ULPS.get(self.precision, 1.0)

    def to_script(self) -> dict[str, Any]:
        """What a repro script needs to rebuild these bands with the same float64 arithmetic
        (cause/repro.py): the tolerance, the bound, and the reference the bands centre on."""
        def tensor(x: np.ndarray | None) -> torch.Tensor | None:
            return None if x is None else torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))

        expected = self.bands[0].centre if self.kind == "normwise" else self.bands[1].centre
        reference = self.bands[2].centre if self.kind == "normwise" and len(self.bands) > 2 else \
            self.bands[0].centre if self.kind == "elementwise" else None
        if reference is None and self.torch is not None:
            reference = self.torch.reference   # the rounding band is off; torch's rule still needs it
        centre = self.bias_centre
        bias_on = None if centre is None or self.u is None else "expected" if centre is expected else \
            "reference" if centre is reference else "own"
        return {"kind": self.kind, "atol": self.atol, "rtol": self.rtol, "bound": self.bound,
                "torch": self.torch.to_script() if self.torch is not None else None,
                "ulps": ELEMENTWISE_ULPS, "u": self.u,
                "overflow": OVERFLOW.get(self.precision),
                "largest": LARGEST.get(self.precision), "tiny": self.tiny, "precision": self.precision,
                "kernel_ulps": self.kernel_ulps,
                "reference": tensor(reference), "bias_on": bias_on,
                "bias_centre": tensor(centre) if bias_on == "own" else None}


def as_f64(t: torch.Tensor) -> np.ndarray:
    # numpy's casts are far faster than torch's; numpy has no bfloat16, so widen that first
    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.reshape(-1).numpy().astype(np.float64)


def flat_f64(t: torch.Tensor) -> np.ndarray:
    """A tensor nested like an output leaf (a residual, a control's output) as flat float64,
    complex values as real and imaginary parts, as the leaf's own values are laid out."""
    t = t.detach().cpu()
    if t.is_complex():
        t = torch.view_as_real(t.to(torch.complex128))
    return as_f64(t)


def _factor(tol: Tolerance) -> float:
    return BASELINE_FACTOR if tol.baseline_factor is None else float(tol.baseline_factor)


def torch_error(ref: np.ndarray, control: torch.Tensor | None, precision: str, u: float,
                tol: Tolerance) -> TorchError | None:
    """Torch's own error on one output against the float64 reference `ref` (flat), from the
    precision control's values; None without a control, on fp32, or with the rule off."""
    factor = PRECISION_FACTOR.get(precision) if tol.precision_factor is None else float(tol.precision_factor)
    if control is None or not factor or precision not in PRECISION_FACTOR:
        return None
    cf = flat_f64(control)
    if cf.size != ref.size:
        return None
    usable = np.isfinite(cf) & np.isfinite(ref)
    if not usable.any():
        return None
    diff = np.abs(cf[usable] - ref[usable])
    floor = TORCH_FLOOR * u * float(np.abs(ref[usable]).max())
    return TorchError(ref, float(np.sqrt(np.mean(diff * diff))), float(diff.max()), factor, floor)


def leaf_rule(e: torch.Tensor, ef: np.ndarray, atol: float, rtol: float, tol: Tolerance,
              aux: "tuple[torch.Tensor | None, ...]", rounding: Rounding | None,
              is_complex: bool) -> LeafRule:
    """The rule of one floating leaf whose flat float64 values are `ef` (see LeafRule)."""
    res, elem, control = aux
    configured = Band(ef, atol + rtol * np.abs(ef))
    if rounding is None:
        return LeafRule("normwise", [configured], atol, rtol)
    u = unit_roundoff(rounding.target_precision, e.dtype)
    precision = precision_of(u)
    tiny = TINY[precision]
    if elem is not None and not is_complex and elem.numel() == ef.size and u > UNIT_ROUNDOFF["fp32"]:
        exact_answer = ef + as_f64(elem)
        return LeafRule("elementwise", [Band(exact_answer, elementwise_allowance(exact_answer, u, tiny)),
                                        Band(ef, np.full_like(ef, atol))],
                        atol, rtol, u, tiny, precision, bias_centre=exact_answer)
    rule = LeafRule("normwise", [configured], atol, rtol, u, tiny, precision, bias_centre=ef)
    if res is None or tuple(res.shape) != tuple(e.shape):
        return rule
    residual = flat_f64(res)
    if residual.size != ef.size:
        return rule
    ref = ef + np.where(np.isfinite(residual), residual, 0.0)
    rule.torch = torch_error(ref, control, precision, u, tol)
    factor = _factor(tol)
    usable = np.isfinite(ef) & np.isfinite(ref)
    if factor <= 0 or not usable.any():
        return rule
    error = float(np.abs(ref - ef)[usable].max())
    magnitude = float(np.abs(ef)[usable].max())
    u_baseline = unit_roundoff(rounding.baseline_precision, e.dtype)
    scaled = factor * error * u / u_baseline
    bound = min(scaled, ALLOWANCE_CAP[precision] * magnitude)
    rule.baseline_error, rule.bound, rule.factor, rule.capped = error, bound, factor, bound < scaled
    rule.bands += [Band(ef, np.full_like(ef, bound)), Band(ref, atol + rtol * np.abs(ref))]
    return rule


def overflowed(rule: LeafRule, af: np.ndarray) -> np.ndarray:
    """Where the target's value is the answer overflowing its precision: the answer (the
    exact one of an elementwise rule, else the golden's) lies past the precision's overflow
    threshold, where no finite value of that precision comes near it, and the target gives
    inf or its precision's largest finite value (saturation), with that sign."""
    limit = OVERFLOW.get(rule.precision)
    if limit is None:
        return np.zeros(af.shape, dtype=bool)
    answer = rule.bands[0].centre
    at_edge = np.isinf(af) | (np.abs(af) == LARGEST[rule.precision])
    return at_edge & (np.abs(answer) >= limit) & (np.sign(af) == np.sign(answer))


def excess_over(rule: LeafRule, af: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How far each element lies outside the nearest band of `rule` (<= 0: it passes), and
    outside the first band alone."""
    first = np.abs(af - rule.bands[0].centre)
    first -= rule.bands[0].width
    best = first
    for band in rule.bands[1:]:
        other = np.abs(af - band.centre)
        other -= band.width
        best = np.minimum(best, other)
    return best, first
