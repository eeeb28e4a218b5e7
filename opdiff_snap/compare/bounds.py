"""The two bounds that hold on top of the normwise allowance of compare/numerics.py: an
elementwise bound in target ulps, and a bias bound on the mean error.

Both work on flat float64 numpy arrays of one output (finite elements only) and return
plain numbers; numerics.py decides the verdict and words the message (docs/check.md,
"When a result passes", says why each bound is what it is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The elementwise bound: units in the last place of the target dtype.
ELEMENTWISE_ULPS = 4.0
# The bias bounds. An output with fewer finite elements is too small to tell a bias from
# rounding; the mean error may be BIAS_SHIFT * u * max|reference| (u: the target's unit
# roundoff); the mean per-element error in target ulps, each clipped to +-DRIFT_CLIP (an
# element near zero after cancellation is off by many ulps in either direction), may be
# DRIFT_BOUND; each bound widens to T_QUANTILE standard errors of its mean when that is larger.
BIAS_MIN_ELEMENTS = 16
BIAS_SHIFT = 0.4
DRIFT_CLIP = 4.0
DRIFT_BOUND = 0.75
# The one-sided 99.95 % quantile of Student's t with 3..31 degrees of freedom: a mean may
# be this many of its standard errors from zero (its standard error from 4..32 block means)
T_QUANTILE = (12.92, 8.61, 6.87, 5.96, 5.41, 5.04, 4.78, 4.59, 4.44, 4.32, 4.22, 4.14, 4.07, 4.01, 3.97,
              3.92, 3.88, 3.85, 3.82, 3.79, 3.77, 3.75, 3.73, 3.71, 3.69, 3.67, 3.66, 3.65, 3.63)
# How many ulps a correct kernel of each precision may be off by, in a consistent direction over
# a range of inputs: fp16 and bf16 kernels compute in float32 and round once (half an ulp, both
# ways); float32 ones are libm-class approximations accurate to a few ulps whose error may keep
# its sign (measured: ExecuTorch's fp32 cos and log against torch's, 0.8 ulps on average one
# way), and float32 running sums in another order wander together (ONNX Runtime's and
# ExecuTorch's cumsum over 512 elements against torch's: a mean error of 2 ulps of the largest).
# The bias bounds are in these units.
KERNEL_ULPS = {"fp16": 1.0, "bf16": 1.0, "fp32": 8.0, "fp64": 8.0}


def ulps(values: np.ndarray, u: float, tiny: float) -> np.ndarray:
    """One unit in the last place at each value, for a dtype of unit roundoff `u` whose
    smallest normal number is `tiny` (the spacing there below it)."""
    _, exponent = np.frexp(np.maximum(np.abs(values), tiny))
    return np.ldexp(u, exponent)


def elementwise_allowance(reference: np.ndarray, u: float, tiny: float) -> np.ndarray:
    """What each element may differ from the float64 result on target-rounded inputs:
    ELEMENTWISE_ULPS target ulps, and below the smallest normal number that number itself
    (a backend that flushes subnormal results to zero is not wrong by thousands of ulps)."""
    allowed = ELEMENTWISE_ULPS * ulps(reference, u, tiny)
    return np.where(np.abs(reference) < tiny, np.maximum(allowed, tiny), allowed)


@dataclass(frozen=True)
class Bias:
    """The mean error of one output (`shift`, in its units) and the mean error in target
    ulps (`drift`; `outward`: measured away from zero rather than toward +inf), each with
    its bound."""

    shift: float
    shift_bound: float
    drift: float
    drift_bound: float
    outward: bool = False

    @property
    def ratio(self) -> float:
        """The larger share of its bound either statistic takes (above 1: biased)."""
        return max(abs(self.shift) / self.shift_bound, abs(self.drift) / self.drift_bound)

    @property
    def broken(self) -> bool:
        return self.ratio > 1.0

    @property
    def by_shift(self) -> bool:
        return abs(self.shift) / self.shift_bound >= abs(self.drift) / self.drift_bound


def _blocks(n: int, row: int) -> list[np.ndarray]:
    """Index blocks for batch means: the rows of the output's last dimension (4 to 32 of them,
    consecutive rows merged), or 4 contiguous chunks when it has fewer than 4 rows."""
    index = np.arange(n)
    rows = n // row if row > 0 else 0
    if rows < 4 or rows * row != n:
        return np.array_split(index, 4)
    return [np.concatenate(group) for group in np.array_split(np.split(index, rows), min(rows, 32))]


def _mean_and_bound(x: np.ndarray, floor: float, blocks: list[np.ndarray]) -> tuple[float, float]:
    """The mean of x over the blocks' elements, and what it may be: `floor`, or more where
    the block means vary as much as a mean that far from zero would (rows share rounded
    intermediates, a softmax's sum or a layer's rounded bias; a running sum's errors are a
    random walk)."""
    blocks = [b for b in blocks if b.size]
    means = np.array([x[b].mean() for b in blocks])
    spread = float(means.std(ddof=1)) / math.sqrt(means.size)
    return float(x[np.concatenate(blocks)].mean()), max(floor, T_QUANTILE[means.size - 4] * spread)


def bias(actual: np.ndarray, centre: np.ndarray, u: float, tiny: float, atol: float = 0.0,
         kernel_ulps: float = 1.0, row: int = 0) -> Bias | None:
    """The bias of `actual` against `centre` (the best reference there is), or None for an
    output too small to tell, or one that is zero everywhere. For the mean error each error
    is first shrunk by `atol` toward zero (what the tolerance's absolute floor allows never
    adds up to a bias); the mean error in ulps is taken over the elements whose ulp is above
    atol (elsewhere the tolerance does not resolve an ulp).
    `kernel_ulps` (KERNEL_ULPS of the target's precision) scales both bounds; `row` is the
    length of the output's last dimension (the values are flat, rows one after another).

    Two directions are measured in ulps: toward +inf (an offset, a rounding mode that
    always rounds up) and away from zero (magnitudes scaled up or down, which cancels in
    the plain mean of an output of both signs); the one further outside its bound counts."""
    n = actual.size
    if n < BIAS_MIN_ELEMENTS:
        return None
    magnitude = float(np.abs(centre).max())
    if magnitude == 0.0 or not math.isfinite(magnitude):
        return None
    diff = actual - centre
    shrunk = np.sign(diff) * np.maximum(np.abs(diff) - atol, 0.0)
    shift, shift_bound = _mean_and_bound(shrunk, BIAS_SHIFT * kernel_ulps * u * magnitude, _blocks(n, row))
    # in ulps, over the elements whose ulp the tolerance resolves (one ulp above atol)
    unit = ulps(centre, u, tiny)
    seen = unit > atol
    if np.count_nonzero(seen) < BIAS_MIN_ELEMENTS:
        return Bias(shift, shift_bound, 0.0, DRIFT_BOUND * kernel_ulps)
    z = np.clip(diff / unit, -DRIFT_CLIP, DRIFT_CLIP)
    blocks = [b[seen[b]] for b in _blocks(n, row)]
    if sum(1 for b in blocks if b.size) < 4:
        return Bias(shift, shift_bound, 0.0, DRIFT_BOUND * kernel_ulps)
    up, up_bound = _mean_and_bound(z, DRIFT_BOUND * kernel_ulps, blocks)
    out, out_bound = _mean_and_bound(z * np.sign(centre), DRIFT_BOUND * kernel_ulps, blocks)
    outward = abs(out) / out_bound > abs(up) / up_bound
    drift, drift_bound = (out, out_bound) if outward else (up, up_bound)
    return Bias(shift=shift, shift_bound=shift_bound, drift=drift, drift_bound=drift_bound, outward=outward)
