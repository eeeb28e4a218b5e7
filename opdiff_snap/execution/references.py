"""What a job computes beside the target's own outputs, to judge them: the float64
reference (record), the float64 result of a single elementwise op on inputs rounded to
the target's dtype (check on fp16/bf16), and torch eager at the target's precision (the
precision control of check on fp16/bf16). Each returns flat outputs like the target's, or
None and why not; none of them raises."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..core.errors import error_text
from ..suite.model import Invocation, TestCase
from .prepare import Prepared, flat_module

_WIDE = (torch.float64, torch.complex128)
REDUCED = {"fp16": torch.float16, "bf16": torch.bfloat16}
# ATen ops that move or copy values without computing: not counted as the op under test
_MOVES = frozenset({"_to_copy", "clone", "copy_", "detach", "lift_fresh", "lift_fresh_copy", "contiguous",
                    "_unsafe_view", "empty_like", "to"})

# Elementwise ops whose result jumps (rounding to an integer, wrapping around, thresholds): a
# one-ulp difference in an input or an intermediate moves the result by a whole step, so no
# correct kernel of the target precision is within ulps of the exact answer everywhere
_DISCONTINUOUS = frozenset({"floor", "ceil", "round", "trunc", "frac", "fmod", "remainder", "floor_divide",
                            "sign", "sgn", "heaviside", "threshold", "hardshrink", "nextafter"})

Flat = list[torch.Tensor | None]


def _floating(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A real floating tensor rounded to `dtype` (when given), then widened to float64."""
    if not t.is_floating_point():
        return t.clone()
    if dtype is not None:
        t = t.to(dtype)
    return t.to(torch.float64)


def _run_float64(prepared: Prepared, rounded_to: torch.dtype | None,
                 mode: TorchDispatchMode | None = None) -> tuple[list[Any] | None, str | None]:
    module = copy.deepcopy(prepared.module).cpu()
    module._apply(lambda t: _floating(t, rounded_to))
    inputs = [_floating(t, rounded_to) for t in prepared.inputs]
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.no_grad():
            if mode is not None:
                with mode:
                    outputs = module(*inputs)
            else:
                outputs = module(*inputs)
    except _NotSingle as exc:
        return None, str(exc)
    except Exception as exc:
        return None, f"the test does not run in float64: {error_text(exc)}"
    finally:
        torch.set_default_dtype(default)
    return [outputs] if isinstance(outputs, torch.Tensor) else list(outputs), None


def _wanted(prepared: Prepared, outputs: list[Any]) -> tuple[Flat | None, str | None]:
    wanted = [dt.is_floating_point and dt not in _WIDE for dt in prepared.out_dtypes]
    if len(outputs) != len(wanted):
        return None, f"in float64 the test returns {len(outputs)} outputs instead of {len(wanted)}"
    reference: Flat = []
    for i, (out, want) in enumerate(zip(outputs, wanted)):
        if not want:
            reference.append(None)
        elif not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None, f"in float64, output {i} is not a floating tensor"
        else:
            reference.append(out.detach().to(torch.float64).contiguous())
    return reference, None


def float64_reference(prepared: Prepared) -> tuple[Flat | None, str | None]:
    """The flat module run eagerly on the CPU in float64: real floating weights and inputs
    cast up, float64 as the default dtype for tensors it creates. Returns the outputs that
    were floating and narrower than float64 (None for the others), or None and why not."""
    if not any(dt.is_floating_point and dt not in _WIDE for dt in prepared.out_dtypes):
        return None, "no output narrower than float64 to measure"
    outputs, why = _run_float64(prepared, None)
    return (None, why) if outputs is None else _wanted(prepared, outputs)


class _NotSingle(Exception):
    """The call computes with more than one elementwise op: stop, there is no exact answer to
    take (a model would otherwise run whole in float64 for nothing)."""


class _OneElementwiseOp(TorchDispatchMode):
    """Lets through value moves and copies and one elementwise (pointwise-tagged) ATen op
    whose result does not jump; raises _NotSingle at anything else."""

    def __init__(self) -> None:
        super().__init__()
        self.op: Any = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (func.is_view or func.overloadpacket.__name__ in _MOVES):
            if self.op is not None or torch.Tag.pointwise not in func.tags:
                raise _NotSingle("not a single elementwise op")
            if func.overloadpacket.__name__.rstrip("_") in _DISCONTINUOUS or "mode" in func._overloadname:
                raise _NotSingle(f"{func} is discontinuous: held to the normwise bound")
            self.op = func
        return func(*args, **(kwargs or {}))


def elementwise_reference(prepared: Prepared, precision: str) -> tuple[Flat | None, str | None]:
    """For a test that is one elementwise ATen op (tagged pointwise): its float64 result on
    the inputs and weights rounded to the target's dtype first, the exact answer a correct
    kernel of that precision rounds. None otherwise, with why."""
    dtype = REDUCED.get(precision)
    if dtype is None:
        return None, f"{precision} targets are held to the normwise bound"
    seen = _OneElementwiseOp()
    outputs, why = _run_float64(prepared, dtype, seen)
    if outputs is None:
        return None, why
    if seen.op is None:
        return None, "not a single elementwise op"
    return _wanted(prepared, outputs)


def needs_control(preset: Any) -> bool:
    """Whether a check on `preset` runs the precision control: on fp16/bf16, unless the preset
    is that control itself (torch eager on the CPU), whose own outputs are it."""
    return preset.precision in REDUCED and not (preset.family == "torch" and preset.device == "cpu")


def precision_control(prepared: Prepared, precision: str) -> tuple[list[torch.Tensor] | None, str | None]:
    """Torch eager on the CPU at the target's precision, on the same inputs and weights:
    what torch itself gets at that precision. Outputs are cast back to the dtypes the eager
    module produces, as the target's are."""
    dtype = REDUCED.get(precision)
    if dtype is None:
        return None, f"no control for {precision}"
    from ..backends.family_common import as_output_list, cast_inputs, cast_module

    try:
        module = cast_module(prepared.module, dtype)
        with torch.no_grad():
            outputs = as_output_list(module(*cast_inputs(prepared.fresh_inputs(), dtype)))
    except Exception as exc:
        return None, f"torch eager does not run it in {precision}: {error_text(exc)}"
    flat: list[torch.Tensor] = []
    for t, eager in zip(outputs, prepared.out_dtypes):
        t = t.detach().cpu()
        if t.dtype in REDUCED.values() and eager.is_floating_point and eager != t.dtype:
            t = t.to(eager)
        flat.append(t.contiguous())
    if len(flat) != len(prepared.out_dtypes):
        return None, f"torch eager in {precision} returns {len(flat)} outputs instead of {len(prepared.out_dtypes)}"
    return flat, None


@dataclass
class ReferencesTask:
    """The elementwise reference and the precision control of a test at a reduced
    precision, computed in a worker (the test's code runs there, never in the caller): for
    a repro script, which judges as check does. Returns (elementwise, structure, control)."""

    case: TestCase
    invocation: Invocation
    precision: str
    key: str = "references"

    def run(self, context: Any = None) -> tuple[Flat | None, Any, list[torch.Tensor] | None]:
        prepared = flat_module(self.case, self.invocation)
        return (elementwise_reference(prepared, self.precision)[0], prepared.out_structure,
                precision_control(prepared, self.precision)[0])

    def failed(self, status: Any, error_class: str | None, message: str) -> tuple[None, None, None]:
        return None, None, None
