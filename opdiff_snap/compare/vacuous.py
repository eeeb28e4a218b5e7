"""Goldens that prove nothing: outputs any plausible answer would match.

A golden whose every floating element lies within atol of zero passes a backend that
returns zeros; one whose outputs are all NaN/Inf passes any backend that overflows the
same way; one whose outputs are a single repeated value says nothing of the computation
that produced it. Record warns about such goldens and every result against them carries
the reason (`Result.vacuous`), so a PASS on them is never mistaken for evidence.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..core.trees import flatten
from ..suite.model import TestCase, Tolerance
from .tolerance import DEFAULT_TOLERANCES


def _values(outputs: Any) -> list[np.ndarray]:
    _, tensors = flatten(outputs)
    out = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        t = t.detach().cpu()
        if t.is_complex():
            t = torch.view_as_real(t)
        if t.dtype == torch.bfloat16:
            t = t.float()
        out.append(t.reshape(-1).numpy().astype(np.float64) if t.dtype != torch.bool else t.reshape(-1).numpy())
    return out


# ATen ops whose every output element is a constant by definition (a size and a fill
# value): their goldens test shape, dtype and the value, which is all there is to test
CONSTANT_BY_DEFINITION = frozenset({
    "aten::full", "aten::full_like", "aten::fill", "aten::fill_", "aten::zeros", "aten::zeros_like",
    "aten::ones", "aten::ones_like", "aten::new_full", "aten::new_zeros", "aten::new_ones",
    "aten::scalar_tensor",
})


def vacuous_reason(outputs: Any, tolerance: Tolerance | None = None, op: str | None = None) -> str | None:
    """Why `outputs` (a golden's) would be matched by almost any answer, or None. `op`:
    the ATen op of an op test (`aten::fill.Scalar`); one that fills by definition is
    never flagged."""
    if op is not None and op.split(".")[0] in CONSTANT_BY_DEFINITION:
        return None
    values = _values(outputs)
    if not values:
        return None
    flat = np.concatenate([v.astype(np.float64) for v in values])
    finite = np.isfinite(flat)
    if not finite.any():
        return f"all {flat.size} output elements are NaN or Inf"
    atol = (tolerance.atol if tolerance is not None and tolerance.atol is not None
            else DEFAULT_TOLERANCES["fp32"].atol) or 0.0
    largest = float(np.abs(flat[finite]).max())
    if finite.all() and largest <= atol:
        return (f"every output element is within atol={atol:g} of zero (largest |value| {largest:.3g}): a backend "
                "returning zeros would pass; scale the inputs or weights so the outputs carry information")
    if flat.size >= 2 and finite.all() and bool((flat == flat[0]).all()):
        return (f"all {flat.size} output elements equal {flat[0]:.6g}: the outputs do not depend on the inputs, "
                "so a backend that computes nothing from them can pass")
    return None


def op_of(case: TestCase) -> str | None:
    """The ATen op an op test calls; None for a module test."""
    return case.call.target if case.call.kind == "op" and case.pair is None else None
