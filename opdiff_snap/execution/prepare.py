"""Turn a test case plus a stored invocation into a *flat* module for backends.

A flat module takes only tensors and returns only a flat tuple of tensors:

    forward(*inputs) -> (out0, out1, ...)

Non-tensor arguments (ints, lists of ints, dtypes, None, constructed objects) are
baked in as constants. Complex tensors never cross the boundary: complex inputs
arrive as real `[..., 2]` tensors and are rebuilt with `view_as_complex` inside the
graph (this is also how `cast_input0_to_complex` works: materialize already stores
input 0 as real pairs); complex outputs leave as `view_as_real`, Python scalar outputs
as 0-d tensors. `out_structure` records how to rebuild the nested output value
(outputs.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..backends.base import Dynamic, DynamicDim
from ..core.errors import OpdiffError
from ..suite import dynamic
from ..suite.construct import bind, call_inputs
from ..suite.model import Invocation, TestCase
from ..suite.torch_call import TorchCall
from .outputs import collect_outputs, output_structure


@dataclass
class Prepared:
    """A flat module, the example inputs it takes, and how to rebuild its outputs.

    `out_dtypes` are the dtypes of the flat outputs as the eager module produced them
    (probed once in fp32 here): reduced-precision outputs are cast back to them.
    """

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    out_structure: Any
    out_dtypes: list[torch.dtype]
    dynamic: Dynamic | None = None     # a sized test's dynamic axes (suite/dynamic.py); None: static

    def fresh_inputs(self) -> list[torch.Tensor]:
        """Copies of the inputs: in-place ops must not change what the next call sees."""
        return [t.clone() for t in self.inputs]


class FlatModule(torch.nn.Module):
    """forward(*tensors) -> tuple of tensors; see the module docstring."""

    def __init__(self, sides: dict[str, Callable[..., Any]], args: list[Any], kwargs: dict[str, Any],
                 complex_slots: set[int]):
        super().__init__()
        self.side_names = list(sides)
        self.fns: dict[str, Callable[..., Any]] = {}
        for name, fn in sides.items():
            if isinstance(fn, torch.nn.Module):
                self.add_module(f"side_{name}", fn)  # registered, so .to(dtype) casts its weights
            else:
                self.fns[name] = fn
        leaves: list[Any] = []
        self._spec = _split((list(args), dict(kwargs)), leaves)
        self._slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self._consts = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        self._complex = [i in complex_slots for i in range(len(self._slots))]

    def _fn(self, side: str) -> Callable[..., Any]:
        return self.fns[side] if side in self.fns else getattr(self, f"side_{side}")

    def call_args(self, tensors: Any) -> tuple[list[Any], dict[str, Any]]:
        """The original (args, kwargs) with `tensors` in the tensor slots."""
        leaves = list(self._consts)
        for slot, is_complex, t in zip(self._slots, self._complex, tensors):
            leaves[slot] = torch.view_as_complex(t) if is_complex else t
        return _join(self._spec, leaves)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        args, kwargs = self.call_args(tensors)
        flat: list[torch.Tensor] = []
        for side in self.side_names:
            collect_outputs(self._fn(side)(*args, **kwargs), flat)
        return tuple(flat)


def flat_module(case: TestCase, invocation: Invocation) -> Prepared:
    """The flat module of (case, invocation), its outputs probed once in eager mode."""
    args, kwargs = call_inputs(case, invocation)
    prepared = prepare_call(bind(case, invocation), args, kwargs, f"test '{case.id}'",
                            keyed=case.pair is not None)
    if case.dynamic is not None:
        prepared.dynamic = dynamic_dims(case, args, kwargs)
        if len(prepared.dynamic) != len(prepared.inputs):
            raise OpdiffError(f"test '{case.id}': its dynamic axes name {len(prepared.dynamic)} input tensors, "
                              f"its call takes {len(prepared.inputs)}; re-record it with --force.")
    return prepared


def dynamic_dims(case: TestCase, args: list[Any], kwargs: dict[str, Any]) -> Dynamic:
    """The dynamic axes of each flat input of a sized test, with its dims' ranges."""
    ranges = dynamic.ranges(case.definition)
    nodes = [*case.inputs, *(case.kwargs.get(k) for k in kwargs)]
    return tuple({axis: DynamicDim(sym, *ranges[sym]) for axis, sym in axes.items()}
                 for axes in dynamic.leaf_axes(nodes, [*args, *kwargs.values()]))


def prepare_call(sides: dict[str, Callable[..., Any]], args: list[Any], kwargs: dict[str, Any],
                 where: str, keyed: bool = False) -> Prepared:
    """A flat module calling each side on (args, kwargs), and one eager probe of it for the
    output structure and dtypes. `keyed`: the outputs are {side: ...} (pair tests); else
    the one side's output. Used for whole tests and for any sub-call worth running alone."""
    # Every complex tensor leaf travels as real pairs and is rebuilt inside forward.
    tensors = _tensor_leaves(args, kwargs)
    complex_slots = {i for i, t in enumerate(tensors) if t.is_complex()}
    inputs = tensor_inputs(args, kwargs)
    module = FlatModule(sides, args, kwargs, complex_slots).eval()
    # the probe calls a copy of a module that may keep state: a first call may leave some
    # behind (a cache of attention biases built in float32, which a later cast to float16
    # does not touch), and what a backend exports should be the module as built, never
    # called. An op or a TorchCall keeps nothing: no copy.
    keeps_state = any(isinstance(fn, torch.nn.Module) and not isinstance(fn, TorchCall) for fn in sides.values())
    probe = module
    if keeps_state:
        try:
            probe = copy.deepcopy(module)
        except Exception:   # a module that cannot be copied (a non-leaf tensor held): probe it
            probe = module

    counter, parts, flat = [0], [], list[Any]()
    with torch.no_grad():
        args_p, kwargs_p = probe.call_args([t.clone() for t in inputs])
        for side in probe.side_names:
            out = probe._fn(side)(*args_p, **kwargs_p)
            parts.append((side, output_structure(out, counter, where + (f" side {side}" if keyed else ""),
                                           depth=1 if keyed else 0)))   # keyed: under {side: ...}
            collect_outputs(out, flat)
    structure = {"dict": [[s, st] for s, st in parts]} if keyed else parts[0][1]
    return Prepared(module, inputs, structure, [t.dtype for t in flat])


def _tensor_leaves(args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    leaves: list[Any] = []
    _split((args, kwargs), leaves)
    return [v for v in leaves if isinstance(v, torch.Tensor)]


def tensor_inputs(args: list[Any], kwargs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """What a flat module of this call takes: its tensor leaves in order, complex ones as
    real pairs."""
    return tuple(torch.view_as_real(t).clone() if t.is_complex() else t.contiguous()
                 for t in _tensor_leaves(args, kwargs))


def _split(x: Any, leaves: list[Any]) -> Any:
    """A spec of plain tuples for lists / tuples / dicts; every other value is a leaf.
    (Plain tuples, not pytree specs: backends deep-copy the module that holds it.)"""
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        return (type(x).__name__, tuple(_split(v, leaves) for v in x))
    if type(x) is dict:
        return ("dict", tuple((k, _split(v, leaves)) for k, v in x.items()))
    leaves.append(x)
    return ("leaf", len(leaves) - 1)


def _join(spec: Any, leaves: list[Any]) -> Any:
    kind, body = spec
    if kind == "leaf":
        return leaves[body]
    if kind == "dict":
        return {k: _join(v, leaves) for k, v in body}
    items = [_join(v, leaves) for v in body]
    return items if kind == "list" else tuple(items)
