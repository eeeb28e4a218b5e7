"""Nested values (args, kwargs, outputs) as a JSON structure plus a flat list of tensors.

The structure is plain JSON, so it can sit in a golden's metadata, travel to a worker,
and be rebuilt anywhere without pickles:

    {"tensor": i}                     the i-th tensor leaf
    {"tuple": [s, ...]}               {"list": [s, ...]}
    {"dict": [[key, s], ...]}         order kept; see dict_key for what a key may be
    {"value": v}                      a JSON literal: number, bool, string, None
    {"float": "nan" | "inf" | "-inf"} a non-finite Python float
    {"dtype": "float32"}              a torch.dtype passed as an argument

A structure nests at most MAX_DEPTH levels below its root: flatten refuses a deeper
value, and the golden store refuses to read a deeper structure, so what record writes
check can always read.

A value of any other type that torch.utils._pytree has a registration for (a
transformers `ModelOutput`, a cache registered for export, a user's own class) is taken
apart by that registration and stored as the plain container of its children
(`as_container`): a dict keyed by field, attribute or mapping key, or a tuple where the
registration gives only positions. It comes back as that container, not as its type.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # flatten/unflatten import it; json_safe and the history need none
    import torch

Structure = Any  # JSON-compatible nested dict/list
MAX_DEPTH = 100   # levels of nesting below a structure's root, for every nested value stored


class TooDeep(ValueError):
    """A value nests deeper than MAX_DEPTH."""

    def __init__(self, where: str):
        super().__init__(f"{where} nests deeper than {MAX_DEPTH} levels, the most a golden holds; "
                         "return a flatter value")


def dict_key(key: Any) -> Any:
    """How a dict key is stored: a JSON literal (string, integer, finite float, bool, None)
    as itself, so 1 and "1" stay two keys; any other key as its str()."""
    if key is None or isinstance(key, (str, int)) or (isinstance(key, float) and math.isfinite(key)):
        return key
    return str(key)


def dict_keys(d: dict, where: str) -> list[Any]:
    """The stored keys of `d` in order; ValueError when two keys would be stored as one
    (a tuple key and the string of it, say), which would lose a value."""
    out: list[Any] = []
    seen: dict[tuple[type, Any], Any] = {}
    for k in d:
        stored = dict_key(k)
        tag = (type(stored), stored)
        if tag in seen:
            raise ValueError(f"{where} has the keys {seen[tag]!r} and {k!r}, which a golden would store as "
                             f"the same key {stored!r}: use keys that differ as strings")
        seen[tag] = k
        out.append(stored)
    return out


def as_container(x: Any) -> dict | tuple | None:
    """`x`'s children by its torch.utils._pytree registration, as a dict (keyed by
    field, attribute or mapping key) or a tuple (positions only); None when its type has
    none, or is registered as a constant (a leaf holding no tensors to compare)."""
    from torch.utils import _pytree as pytree

    node = pytree.SUPPORTED_NODES.get(type(x))
    if node is None or pytree.is_constant_class(type(x)):
        return None
    if node.flatten_with_keys_fn is None:
        return tuple(node.flatten_fn(x)[0])
    pairs = node.flatten_with_keys_fn(x)[0]
    if all(isinstance(k, pytree.SequenceKey) for k, _ in pairs):
        return tuple(v for _, v in pairs)
    named = {getattr(k, "key", getattr(k, "name", None)): v for k, v in pairs}
    return named if None not in named and len(named) == len(pairs) else {str(k): v for k, v in pairs}


def flatten(obj: Any, where: str = "the value") -> tuple[Structure, list[torch.Tensor]]:
    """(structure, tensor leaves). Raises TypeError for a value a golden cannot hold and
    ValueError (TooDeep, or keys that collide) naming `where`."""
    import torch

    leaves: list[torch.Tensor] = []

    def walk(x: Any, depth: int) -> Structure:
        if depth > MAX_DEPTH:
            raise TooDeep(where)
        if isinstance(x, torch.Tensor):
            leaves.append(x)
            return {"tensor": len(leaves) - 1}
        if isinstance(x, tuple):
            return {"tuple": [walk(v, depth + 1) for v in x]}
        if isinstance(x, list):
            return {"list": [walk(v, depth + 1) for v in x]}
        if isinstance(x, dict):
            return {"dict": [[k, walk(v, depth + 1)] for k, v in zip(dict_keys(x, where), x.values())]}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, float) and not math.isfinite(x):
            return {"float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"value": x}
        container = as_container(x)
        if container is not None:
            return walk(container, depth)
        raise TypeError(f"cannot store a value of type {type(x).__name__} in a golden: {x!r}")

    return walk(obj, 0), leaves


def unflatten(structure: Structure, leaves: list[Any],
              special: dict[str, Callable[[dict], Any]] | None = None) -> Any:
    """Inverse of flatten; `leaves` may be tensors or arrays. `special` builds node kinds
    of the caller's own (a node may carry a `type` key beside its kind)."""
    import torch

    def build(s: Structure) -> Any:
        kind = next(k for k in s if k != "type")
        v = s[kind]
        if special and kind in special:
            return special[kind](s)
        if kind == "tensor":
            return leaves[v]
        if kind == "tuple":
            return tuple(build(e) for e in v)
        if kind == "list":
            return [build(e) for e in v]
        if kind == "dict":
            return {k: build(e) for k, e in v}
        if kind == "dtype":
            return getattr(torch, v)
        if kind == "float":
            return float(v)
        if kind == "value":
            return v
        raise ValueError(f"unknown structure node {kind!r}")

    return build(structure)


def count_tensors(structure: Structure) -> int:
    if isinstance(structure, dict):
        if "tensor" in structure:
            return 1
        return sum(count_tensors(v) for v in structure.values())
    if isinstance(structure, list):
        return sum(count_tensors(v) for v in structure)
    return 0


def json_safe(obj: Any) -> Any:
    """A copy with non-finite floats as the strings "nan", "inf", "-inf" (JSON has no NaN)
    and tuples as lists: what the history and goldens write."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
