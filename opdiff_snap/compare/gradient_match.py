"""Recorded gradients compared with recomputed ones, under a tolerance widened for them."""

from __future__ import annotations

from typing import Mapping

import torch

from ..core.verdicts import Verdict
from ..suite.model import Tolerance
from .metrics import Metrics
from .numerics import Comparison, compare


def grad_tolerance(tol: Tolerance, expected: torch.Tensor) -> Tolerance:
    """The output tolerance widened for gradients: a gradient carries the forward's
    rounding and the backward's (so 2 x rtol), and its entries are sums whose error
    scales with the tensor's largest entry rather than with each small entry, so atol
    is at least 2 x rtol x max|g|. Measured on torch_cpu_bf16 (tests/helpers/cause):
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
