"""The output structure of a flat module (prepare.py): how the nested value a test returns
is numbered into flat tensors and rebuilt from them. Both sides use it: the worker that
runs the flat module, and the parent that judges or records its outputs.

`out_structure` is a core/trees.py structure with two extra leaf kinds,

    {"complex": i}               flat output i is a real [..., 2] view of a complex tensor
    {"scalar": i, "type": "int"} flat output i is a 0-d tensor standing for a Python
                                 int / float / bool

A pair test runs side a and side b on the same inputs; its structure is
`{"dict": [["a", ...], ["b", ...]]}`, side b's leaf indices following side a's.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core import trees
from ..core.errors import OpdiffError

_SCALAR_TYPES = {"bool": bool, "int": int, "float": float}


def collect_outputs(out: Any, flat: list[torch.Tensor]) -> None:
    """Append the output leaves of `out` to `flat`, in the order `output_structure` numbers them."""
    if isinstance(out, torch.Tensor):
        # a conjugate or negative view (fft's inverse transforms return them) has no real view
        flat.append(torch.view_as_real(out.resolve_conj().resolve_neg()) if out.is_complex() else out)
    elif isinstance(out, (tuple, list)):
        for v in out:
            collect_outputs(v, flat)
    elif isinstance(out, dict):
        for v in out.values():
            collect_outputs(v, flat)
    elif isinstance(out, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)):
        flat.append(torch.tensor(out))
    elif out is not None and not isinstance(out, (str, torch.dtype)):
        container = trees.as_container(out)
        if container is not None:
            collect_outputs(container, flat)


def output_structure(out: Any, counter: list[int], where: str, depth: int = 0, at: str = "") -> Any:
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
        return {"tuple": [output_structure(v, counter, where, depth + 1, f"{at}[{i}]") for i, v in enumerate(out)]}
    if isinstance(out, list):
        return {"list": [output_structure(v, counter, where, depth + 1, f"{at}[{i}]") for i, v in enumerate(out)]}
    if isinstance(out, dict):
        try:
            keys = trees.dict_keys(out, f"the output of {where}")
        except ValueError as exc:
            raise OpdiffError(str(exc)) from None
        return {"dict": [[k, output_structure(v, counter, where, depth + 1, f"{at}[{k!r}]")]
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
        return output_structure(container, counter, where, depth, at)
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


def flat_values(value: Any) -> list[torch.Tensor]:
    """A nested output value's leaves in the order flat modules return them."""
    flat: list[torch.Tensor] = []
    collect_outputs(value, flat)
    return flat
