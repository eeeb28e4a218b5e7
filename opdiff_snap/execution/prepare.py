"""Turn a test case plus a stored invocation into a *flat* module for backends.

A flat module takes only tensors and returns only a flat tuple of tensors:

    forward(*inputs) -> (out0, out1, ...)

Non-tensor arguments (ints, lists of ints, dtypes, None, constructed objects) are
baked in as constants. Complex tensors never cross the boundary: complex inputs
arrive as real `[..., 2]` tensors and are rebuilt with `view_as_complex` inside the
graph (this is also how `cast_input0_to_complex` works: materialize already stores
input 0 as real pairs); complex outputs leave as `view_as_real`. Python scalar outputs
leave as 0-d tensors. `out_structure` records how to rebuild the nested output value
(see `restore_outputs`): it is a core/trees.py structure with two extra leaf kinds,

    {"complex": i}               flat output i is a real [..., 2] view of a complex tensor
    {"scalar": i, "type": "int"} flat output i is a 0-d tensor standing for a Python
                                 int / float / bool

A pair test runs side a and side b on the same inputs; its structure is
`{"dict": [["a", ...], ["b", ...]]}`, side b's leaf indices following side a's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..backends.base import Dynamic, DynamicDim
from ..core import trees
from ..core.errors import OpdiffError
from ..suite import dynamic
from ..suite.construct import bind, call_inputs
from ..suite.model import Invocation, TestCase
from ..suite.torch_call import TorchCall

_SCALAR_TYPES = {"bool": bool, "int": int, "float": float}


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
            _collect(self._fn(side)(*args, **kwargs), flat)
        return tuple(flat)


def _collect(out: Any, flat: list[torch.Tensor]) -> None:
    """Append the output leaves of `out` to `flat`, in the order `_structure` numbers them."""
    if isinstance(out, torch.Tensor):
        # a conjugate or negative view (fft's inverse transforms return them) has no real view
        flat.append(torch.view_as_real(out.resolve_conj().resolve_neg()) if out.is_complex() else out)
    elif isinstance(out, (tuple, list)):
        for v in out:
            _collect(v, flat)
    elif isinstance(out, dict):
        for v in out.values():
            _collect(v, flat)
    elif isinstance(out, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
        flat.append(torch.tensor(out))
    elif out is not None and not isinstance(out, (str, torch.dtype)):
        container = trees.as_container(out)
        if container is not None:
            _collect(container, flat)


def _structure(out: Any, counter: list[int], where: str, depth: int = 0, at: str = "") -> Any:
    """The out_structure of one eager output value; `counter[0]` numbers the leaves, `at`
    is the position in the output. Refuses (OpdiffError) what a golden could not hold: a
    value nested deeper than trees.MAX_DEPTH, dict keys that would be stored as one, a
    type that is neither plain nor registered with torch.utils._pytree."""

    def leaf(kind: str, **extra: Any) -> dict[str, Any]:
        node = {kind: counter[0], **extra}
        counter[0] += 1
        return node

    if depth > trees.MAX_DEPTH:
        raise OpdiffError(str(trees.TooDeep(f"the output of {where}")))
    if isinstance(out, torch.Tensor):
        return leaf("complex") if out.is_complex() else leaf("tensor")
    if isinstance(out, tuple):
        return {"tuple": [_structure(v, counter, where, depth + 1, f"{at}[{i}]") for i, v in enumerate(out)]}
    if isinstance(out, list):
        return {"list": [_structure(v, counter, where, depth + 1, f"{at}[{i}]") for i, v in enumerate(out)]}
    if isinstance(out, dict):
        try:
            keys = trees.dict_keys(out, f"the output of {where}")
        except ValueError as exc:
            raise OpdiffError(str(exc)) from None
        return {"dict": [[k, _structure(v, counter, where, depth + 1, f"{at}[{k!r}]")]
                         for k, v in zip(keys, out.values())]}
    if isinstance(out, bool):
        return leaf("scalar", type="bool")
    if isinstance(out, int):
        return leaf("scalar", type="int")
    if isinstance(out, float):
        return leaf("scalar", type="float")
    if out is None or isinstance(out, str):
        return {"value": out}
    if isinstance(out, torch.dtype):
        return {"dtype": str(out).removeprefix("torch.")}
    container = trees.as_container(out)
    if container is not None:
        return _structure(container, counter, where, depth, at)
    raise OpdiffError(unstorable(out, where, f"output{at}" if at else "its output"))


def unstorable(value: Any, where: str, at: str) -> str:
    """Why an output of this type cannot be compared, and what to do."""
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if kind.__module__.startswith("transformers.") and kind.__name__.endswith("Cache"):
        return (f"{where} returns a {kind.__name__} as {at}: the key/value cache a transformers model returns "
                "while use_cache is on. Set use_cache: false in the test's config. (The cache cannot be "
                f"compared: torch.utils._pytree has no registration for {name} to take its tensors out; "
                "registering one with torch.utils._pytree.register_pytree_node where the module is built "
                "would compare them.)")
    return (f"{where} returns a {kind.__name__} as {at}, and torch.utils._pytree has no registration for {name} "
            "to take its tensors out, so it cannot be compared (a golden holds tensors, numbers, strings, None, "
            "and tuples, lists, dicts or pytree-registered types of them). Return tensors instead, or register "
            "the type with torch.utils._pytree.register_pytree_node where the module is defined.")


def restore_outputs(structure: Any, outputs: list[torch.Tensor]) -> Any:
    """The nested output value from flat outputs: complex tensors rebuilt from real pairs,
    Python scalars from 0-d tensors, constants (None, strings) from the structure."""

    def complex_leaf(s: dict) -> Any:
        t = outputs[s["complex"]]
        if t.shape[-1:] != (2,) or not t.is_floating_point():
            raise ValueError(f"output {s['complex']} should be a complex tensor as real [..., 2] pairs, got a "
                             f"{str(t.dtype).removeprefix('torch.')} tensor of shape {list(t.shape)}")
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()  # there is no complex bfloat16, and complex32 is barely usable
        return torch.view_as_complex(t.contiguous())

    def scalar_leaf(s: dict) -> Any:
        t = outputs[s["scalar"]]
        if t.numel() != 1 or (s["type"] != "float" and (t.is_floating_point() or t.is_complex())):
            raise ValueError(f"output {s['scalar']} should be a Python {s['type']} (one element), got a "
                             f"{str(t.dtype).removeprefix('torch.')} tensor of shape {list(t.shape)}")
        return _SCALAR_TYPES[s["type"]](t.item())

    return trees.unflatten(structure, list(outputs), {"complex": complex_leaf, "scalar": scalar_leaf})


def nest_residuals(structure: Any, reference: list[torch.Tensor | None], expected: Any) -> Any:
    """float64 reference minus expected value per floating tensor leaf, nested like
    `expected` (the restored outputs a golden holds): float32, complex64 for complex
    leaves; None for every other leaf and where the shapes differ. `reference` is flat,
    as `float64_reference` returns it for `structure`."""

    def build(s: Any, value: Any) -> Any:
        kind = next(k for k in s if k != "type")
        v = s[kind]
        if kind in ("tensor", "complex"):
            ref = reference[v] if v < len(reference) else None
            if ref is None or not isinstance(value, torch.Tensor):
                return None
            if kind == "complex":
                if ref.shape[-1:] != (2,):
                    return None
                ref = torch.view_as_complex(ref.contiguous())
            if tuple(ref.shape) != tuple(value.shape):
                return None
            wide = torch.complex128 if kind == "complex" else torch.float64
            narrow = torch.complex64 if kind == "complex" else torch.float32
            return (ref.to(wide) - value.detach().to(wide)).to(narrow)
        if kind in ("tuple", "list"):
            if not isinstance(value, (tuple, list)) or len(value) != len(v):
                return None
            items = [build(e, x) for e, x in zip(v, value)]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict":
            if not isinstance(value, dict):
                return None
            return {k: build(e, value.get(k)) for k, e in v}
        return None

    return build(structure, expected)


def count_outputs(structure: Any) -> int:
    """How many flat outputs a structure refers to."""
    if isinstance(structure, dict):
        if any(k in structure for k in ("tensor", "complex", "scalar")):
            return 1
        return sum(count_outputs(v) for v in structure.values())
    if isinstance(structure, list):
        return sum(count_outputs(v) for v in structure)
    return 0


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
            parts.append((side, _structure(out, counter, where + (f" side {side}" if keyed else ""),
                                           depth=1 if keyed else 0)))   # keyed: under {side: ...}
            _collect(out, flat)
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


def flat_values(value: Any) -> list[torch.Tensor]:
    """A nested output value's leaves in the order flat modules return them."""
    flat: list[torch.Tensor] = []
    _collect(value, flat)
    return flat


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
