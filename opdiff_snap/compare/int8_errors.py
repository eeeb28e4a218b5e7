"""Judging an int8 result: two errors, measured apart.

- **Lowering error**: the backend's outputs against the quantized reference (the same
  model after quantization, before lowering, run in torch or with the runtime's
  optimizations off), in quantization steps of each output. An output's step is the
  scale of the dequantize that produces it; where none does (dynamic activations, an
  output computed in float) it is max|reference| / 127, one step of a symmetric 8-bit
  grid over that output's range. This is the backend's error: MISMATCH beyond `steps`
  (the largest) or beyond BIAS_STEPS (the mean signed error, a shift every element shares,
  where the mean stands out of its own noise: at least BIAS_ELEMENTS elements, and more
  than BIAS_SIGMAS standard errors from zero).
- **Quantization error**: the quantized reference against the fp32 golden, as SQNR in
  dB. Always reported; a verdict (SQNR_LOW) only where a tolerance sets `min_sqnr`.

Outputs that are not floating (an argmax, a mask) are held exactly to the reference's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.verdicts import Verdict
from ..suite.model import Tolerance

# The lowering tolerance in steps, by precision, where no tolerance sets `steps`
# (docs/check.md, "int8 presets: two errors"; measured with bench/bench_int8.py).
STEPS = {"int8": 2.0, "int8pt": 2.0, "int8dyn": 2.0}
# The mean signed lowering error, in steps, a result may have on any output, where that
# mean is more than BIAS_SIGMAS standard errors from zero over at least BIAS_ELEMENTS
# elements (two logits, one a step off, are not a shift).
BIAS_STEPS = 0.5
BIAS_ELEMENTS = 8
BIAS_SIGMAS = 3.0
RANGE_LEVELS = 127.0
SLACK = 1e-3   # of a step: float rounding in the division


@dataclass
class QuantError:
    """What `judge_int8` measured (the numbers of compare.Metrics' quant_* and lowering_*)."""

    verdict: Verdict
    message: str
    sqnr: float | None             # dB, quantized reference against the golden
    lowering_sqnr: float | None    # dB, backend against the quantized reference
    lowering_steps: float          # largest |backend - reference| in steps, over the outputs
    lowering_bias: float           # largest |mean(backend - reference)| in steps, over the outputs
    step: float | None             # the step of the output with the largest error
    failed: str | None             # "lowering" or "quantization"; None: neither


def sqnr_db(signal: Sequence[torch.Tensor], other: Sequence[torch.Tensor]) -> float | None:
    """10 log10(sum signal^2 / sum (signal - other)^2) over the finite elements of all
    pairs together; inf when they agree, None when there is nothing finite to measure."""
    power = noise = 0.0
    for s, o in zip(signal, other):
        s64, o64 = s.double(), o.double()
        keep = torch.isfinite(s64) & torch.isfinite(o64)
        power += float((s64[keep] ** 2).sum())
        noise += float(((s64[keep] - o64[keep]) ** 2).sum())
    if power == 0.0 and noise == 0.0:
        return None
    if noise == 0.0:
        return math.inf
    if power == 0.0:
        return -math.inf
    return 10.0 * math.log10(power / noise)


def judge_int8(golden: Sequence[torch.Tensor], actual: Sequence[torch.Tensor], reference: Sequence[torch.Tensor],
               scales: Sequence[float | None], tol: Tolerance, precision: str) -> QuantError:
    """The verdict of an int8 result from its flat outputs, the golden's and the quantized
    reference's (all flat alike), and each output's dequantize scale (None: none)."""
    allowed = tol.steps if tol.steps is not None else STEPS.get(precision, 2.0)
    if len(reference) != len(actual) or len(golden) != len(actual):
        return QuantError(Verdict.STRUCTURE_MISMATCH, f"the quantized reference has {len(reference)} outputs, the "
                          f"backend {len(actual)} and the golden {len(golden)}", None, None, math.inf, math.inf,
                          None, "lowering")
    shapes = [i for i, (r, a) in enumerate(zip(reference, actual)) if r.shape != a.shape]
    if shapes:
        i = shapes[0]
        return QuantError(Verdict.SHAPE_MISMATCH, f"out[{i}] has shape {tuple(actual[i].shape)}; the quantized "
                          f"reference's is {tuple(reference[i].shape)}", None, None, math.inf, math.inf, None,
                          "lowering")
    floating = [i for i, r in enumerate(reference) if r.is_floating_point()]
    worst_steps, worst_bias, worst_at, worst_step = 0.0, 0.0, None, None
    shifted = 0.0   # the largest mean that stands out of its noise
    for i in range(len(reference)):
        r, a = reference[i], actual[i]
        if i not in floating:
            if not torch.equal(a.to(r.dtype), r):
                differ = int((a.to(r.dtype) != r).sum())
                return _quant(Verdict.MISMATCH, f"lowering error: out[{i}] ({r.dtype}) differs from the quantized "
                              f"reference in {differ} of {r.numel()} elements; it must equal it", golden, actual,
                              reference, math.inf, math.inf, None, "lowering")
            continue
        r64, a64 = r.double(), a.double()
        step = scales[i] if i < len(scales) and scales[i] else None
        if step is None:   # the reference's range, or the golden's where the reference is all zero
            step = max(_range(r64), _range(golden[i].double())) / RANGE_LEVELS
        if not torch.equal(torch.isnan(r64), torch.isnan(a64)) or not torch.equal(torch.isinf(r64), torch.isinf(a64)):
            return _quant(Verdict.MISMATCH, f"lowering error: out[{i}] is non-finite where the quantized reference "
                          "is not, or the other way round", golden, actual, reference, math.inf, math.inf, step,
                          "lowering")
        keep = torch.isfinite(r64)
        err = (a64 - r64)[keep]
        if not err.numel():
            continue
        largest, bias = float(err.abs().max()), abs(float(err.mean()))
        in_steps = largest / step if step > 0 else (0.0 if largest == 0 else math.inf)
        bias_steps = bias / step if step > 0 else (0.0 if bias == 0 else math.inf)
        if in_steps > worst_steps or worst_at is None:
            worst_steps, worst_at, worst_step = in_steps, i, step
        worst_bias = max(worst_bias, bias_steps)
        n = err.numel()
        if n >= BIAS_ELEMENTS and bias > BIAS_SIGMAS * float(err.std()) / math.sqrt(n):
            shifted = max(shifted, bias_steps)
    # errors on a quantized output come in whole steps: 2.0000001 steps is 2
    if worst_steps > allowed + SLACK or shifted > BIAS_STEPS:
        what = (f"up to {worst_steps:.3g} quantization steps (above the {allowed:g}-step tolerance)"
                if worst_steps > allowed + SLACK else
                f"a mean signed error of {shifted:.3g} steps (above {BIAS_STEPS:g}: every element shifted alike)")
        return _quant(Verdict.MISMATCH, f"lowering error: out[{worst_at}] differs from the quantized reference by "
                      f"{what}; one step there is {worst_step:.4g}. The backend computes the quantized model "
                      "differently from the quantizer's own reference", golden, actual, reference, worst_steps,
                      worst_bias, worst_step, "lowering")
    sqnr = sqnr_db([golden[i] for i in floating], [reference[i] for i in floating])
    if tol.min_sqnr is not None and sqnr is not None and sqnr < tol.min_sqnr:
        return _quant(Verdict.SQNR_LOW, f"quantization error: the quantized model (before lowering) is {sqnr:.3g} dB "
                      f"SQNR from the fp32 golden, below the {tol.min_sqnr:g} dB asked; the backend matches it "
                      f"(lowering error {worst_steps:.3g} steps). Look at the quantizer and its calibration",
                      golden, actual, reference, worst_steps, worst_bias, worst_step, "quantization")
    return _quant(Verdict.PASS, "", golden, actual, reference, worst_steps, worst_bias, worst_step, None)


def _range(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def _quant(verdict: Verdict, message: str, golden: Sequence[torch.Tensor], actual: Sequence[torch.Tensor],
           reference: Sequence[torch.Tensor], steps: float, bias: float, step: float | None,
           failed: str | None) -> QuantError:
    floating = [i for i, r in enumerate(reference) if r.is_floating_point()]
    sqnr = sqnr_db([golden[i] for i in floating], [reference[i] for i in floating])
    lowering = sqnr_db([reference[i] for i in floating], [actual[i] for i in floating])
    return QuantError(verdict, message, sqnr, lowering, steps, bias, step, failed)
