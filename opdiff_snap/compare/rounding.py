"""The rounding a target's outputs are judged with against a golden (rules.Rounding),
made from the golden and what a job computed beside the target, for check's judge and
for repro scripts alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..execution.outputs import nest_residuals, restore_outputs
from .rules import Rounding

if TYPE_CHECKING:
    from ..backends.base import Preset
    from ..goldens import Golden


def rounding_for(golden: Golden, preset: Preset, structure: Any = None,
                 elementwise: list | None = None, control: list | None = None) -> Rounding:
    """What a target's outputs are judged with against `golden` (compare.numerics.Rounding):
    the golden's float64 reference, the precisions, and the elementwise reference and the
    precision control (flat, as a job computes them for `structure`) when there are."""
    nested = None if elementwise is None else nest_residuals(structure, elementwise, golden.outputs)
    own = None if control is None else restore_outputs(structure, control)
    return Rounding(golden.reference, str(golden.baseline.get("precision") or "fp32"), preset.precision, nested,
                    own)
