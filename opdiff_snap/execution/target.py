"""Rebuild what a test calls, from its case and a stored invocation (weights loaded).

Gradients and localize need the *unflattened* call (the module itself, its args and
kwargs): hooks must see the real module tree, and gradients are taken w.r.t. named
inputs and parameters. Backends get flat modules instead (prepare.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..core.errors import OpdiffError
from ..suite.construct import bind, call_inputs
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


def build_target(case: TestCase, invocation: Invocation, side: str = "a") -> Target:
    call = case.call if side == "a" else case.pair
    if call is None:
        raise OpdiffError(f"test '{case.id}' has no side '{side}'.")
    fn = bind(case, invocation)[side]
    args, kwargs = call_inputs(case, invocation)
    return Target(fn, fn if isinstance(fn, torch.nn.Module) else None, args, kwargs)
