"""Rebuild what a test calls, from its case and a stored invocation (weights loaded).

The cause tools need the *unflattened* call (the module itself, its args and kwargs):
hooks must see the real module tree, and gradients are taken w.r.t. named inputs and
parameters. Backends get flat modules instead; see localize.FlatCall.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import OpdiffError
from ..suite.construct import build_modules, resolve_op
from ..suite.model import Invocation, TestCase


@dataclass
class Target:
    """A callable (a module with the stored state loaded, or an ATen op) and fresh
    copies of its inputs. `module` is None for op tests."""

    fn: Callable[..., Any]
    module: torch.nn.Module | None
    args: list[Any]
    kwargs: dict[str, Any]

    def __call__(self) -> Any:
        return self.fn(*self.args, **self.kwargs)


def fresh_inputs(case: TestCase, invocation: Invocation) -> tuple[list[Any], dict[str, Any]]:
    """Deep copies of the stored args/kwargs (a caller may mutate or cast them), with
    input 0 rebuilt as complex when the test travels it as real [..., 2]."""
    args = copy.deepcopy(list(invocation.args))
    kwargs = copy.deepcopy(dict(invocation.kwargs))
    if case.cast_input0_to_complex and args and isinstance(args[0], torch.Tensor) \
            and not args[0].is_complex() and args[0].shape[-1:] == (2,):
        args[0] = torch.view_as_complex(args[0].contiguous())
    return args, kwargs


def build_target(case: TestCase, invocation: Invocation, side: str = "a") -> Target:
    args, kwargs = fresh_inputs(case, invocation)
    call = case.call if side == "a" else case.pair
    if call is None:
        raise OpdiffError(f"test '{case.id}' has no side '{side}'.")
    if call.kind == "op":
        return Target(resolve_op(call.target), None, args, kwargs)
    module = build_modules(case)[side]
    state = invocation.states.get(side)
    if state is None:
        raise OpdiffError(f"test '{case.id}': the stored invocation has no module state for side "
                          f"'{side}'. Re-record the golden.")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise OpdiffError(f"test '{case.id}': the stored weights do not fit the module built from "
                          f"{call.target} ({exc}). The module changed since record: re-record.") from exc
    return Target(module.eval(), module, args, kwargs)


def is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
