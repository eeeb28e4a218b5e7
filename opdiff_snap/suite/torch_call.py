"""A test that calls a torch function or Tensor method, written as a module node.

    op: {type: module, path: opdiff_snap.suite.torch_call.TorchCall,
         kwargs: {fn: torch.nn.functional.conv2d,
                  args: [{input: 0}, {input: 1}], kwargs: {stride: [2, 1], groups: 1}}}
    in: [{type: const_tensor, ...}, {type: const_tensor, ...}]

`fn` is a dotted path (`torch.add`, `torch.linalg.norm`) or a Tensor method
(`Tensor.add`, `Tensor.add_`: its first argument is `self`). `args` and `kwargs` say how
the call is made from the test's inputs:

    {input: i}                      the test's i-th input tensor
    {dtype: float64}                a torch.dtype
    {memory_format: channels_last}  a torch.memory_format
    {float: nan | inf | -inf}       a non-finite float
    a list                          a list (torch takes a list wherever it takes a tuple)
    a number, string, bool, null    itself

Every tensor is an input, so exporters see what a model's graph would see; everything
else is baked into the module and into the test's spec hash. `opdiff import opinfo`
writes its tests in this form; it is as usable by hand.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ..core.errors import OpdiffError
from .torch_fns import EXAMPLES, fn_refusal, object_refusal

TAGS = ("input", "dtype", "memory_format", "float")


class Unencodable(ValueError):
    """An argument this form cannot say (a callable, a slice, a nested dict...)."""


def encode(value: Any, tensors: list[torch.Tensor]) -> Any:
    """The suite form of one argument; tensors are appended to `tensors` as inputs."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"input": len(tensors) - 1}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):   # torch.Size too
        return [encode(v, tensors) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    raise Unencodable(f"an argument of type {type(value).__name__}")


def decode(form: Any, inputs: tuple[torch.Tensor, ...], where: str) -> Any:
    if isinstance(form, list):
        return [decode(v, inputs, where) for v in form]
    if isinstance(form, dict):
        if len(form) != 1 or next(iter(form)) not in TAGS:
            raise OpdiffError(f"{where}: {form!r} is not an argument form; use one of "
                              + ", ".join(f"{{{t}: ...}}" for t in TAGS) + " or a plain value.")
        tag, v = next(iter(form.items()))
        if tag == "input":
            if not isinstance(v, int) or not 0 <= v < len(inputs):
                raise OpdiffError(f"{where}: {{input: {v!r}}} names no input; the test has "
                                  f"{len(inputs)} input(s), numbered from 0.")
            return inputs[v]
        if tag == "float":
            return float(v)
        obj = getattr(torch, str(v), None)
        kind = torch.dtype if tag == "dtype" else torch.memory_format
        if not isinstance(obj, kind):
            raise OpdiffError(f"{where}: torch has no {tag} {v!r}.")
        return obj
    return form


def _check_form(form: Any, where: str) -> None:
    """Refuse a malformed form when the module is built, before any input exists."""
    probe = tuple(torch.empty(0) for _ in range(_max_input(form) + 1))
    decode(form, probe, where)


def _max_input(form: Any) -> int:
    if isinstance(form, list):
        return max((_max_input(v) for v in form), default=-1)
    if isinstance(form, dict) and isinstance(form.get("input"), int):
        return form["input"]
    return -1


def resolve_fn(fn: str) -> Any:
    """The function `fn` names, if a TorchCall may call it (suite/torch_fns.py): looked up
    on torch's own namespace objects, never imported, and judged by name and by object."""
    why = fn_refusal(fn)
    if why is not None:
        raise OpdiffError(f"TorchCall: {why}. A TorchCall calls only torch's operator functions and Tensor "
                          f"methods ({EXAMPLES}).")
    parts = fn.split(".")
    if parts[0] == "Tensor":
        owner: Any = torch.Tensor
    elif parts[:3] == ["torch", "ops", "aten"]:
        owner, parts = torch.ops.aten, ["Tensor", *parts[3:]]
    else:   # a namespace fn_refusal allowed: walked on torch's own module objects, never imported
        owner = functools.reduce(getattr, parts[1:-1], torch)
        parts = ["Tensor", parts[-1]]
    obj = owner
    for part in parts[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            raise OpdiffError(f"TorchCall: {fn} does not exist in torch {torch.__version__.split('+')[0]}.")
    why = object_refusal(fn, obj)
    if why is not None:
        raise OpdiffError(f"TorchCall: {why}. A TorchCall calls only torch's operator functions and Tensor "
                          f"methods ({EXAMPLES}).")
    return obj


class TorchCall(torch.nn.Module):
    """fn(*args, **kwargs) with the test's inputs put where `args`/`kwargs` say."""

    def __init__(self, fn: str, args: list | None = None, kwargs: dict | None = None):
        super().__init__()
        self.fn = fn
        self._call = resolve_fn(fn)
        self.args_form = list(args or [])
        self.kwargs_form = dict(kwargs or {})
        _check_form(self.args_form, f"TorchCall({fn}) args")
        _check_form(list(self.kwargs_form.values()), f"TorchCall({fn}) kwargs")

    def forward(self, *inputs: torch.Tensor) -> Any:
        args = decode(self.args_form, inputs, self.fn)
        kwargs = {k: decode(v, inputs, self.fn) for k, v in self.kwargs_form.items()}
        return self._call(*args, **kwargs)

    def extra_repr(self) -> str:
        return self.fn
