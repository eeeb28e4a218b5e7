"""Nested values (args, kwargs, outputs) as a JSON structure plus a flat list of tensors.

The structure is plain JSON, so it can sit in a golden's metadata, travel to a worker,
and be rebuilt anywhere without pickles:

    {"tensor": i}                     the i-th tensor leaf
    {"tuple": [s, ...]}               {"list": [s, ...]}
    {"dict": [[key, s], ...]}         keys are strings, order kept
    {"value": v}                      a JSON literal: number, bool, string, None
    {"float": "nan" | "inf" | "-inf"} a non-finite Python float
    {"dtype": "float32"}              a torch.dtype passed as an argument
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

Structure = Any  # JSON-compatible nested dict/list


def flatten(obj: Any) -> tuple[Structure, list[torch.Tensor]]:
    leaves: list[torch.Tensor] = []

    def walk(x: Any) -> Structure:
        if isinstance(x, torch.Tensor):
            leaves.append(x)
            return {"tensor": len(leaves) - 1}
        if isinstance(x, tuple):
            return {"tuple": [walk(v) for v in x]}
        if isinstance(x, list):
            return {"list": [walk(v) for v in x]}
        if isinstance(x, dict):
            return {"dict": [[str(k), walk(v)] for k, v in x.items()]}
        if isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if isinstance(x, float) and not math.isfinite(x):
            return {"float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if x is None or isinstance(x, (bool, int, float, str)):
            return {"value": x}
        raise TypeError(f"cannot store a value of type {type(x).__name__} in a golden: {x!r}")

    return walk(obj), leaves


def unflatten(structure: Structure, leaves: list[Any],
              special: dict[str, Callable[[dict], Any]] | None = None) -> Any:
    """Inverse of flatten; `leaves` may be tensors or arrays. `special` builds node kinds
    of the caller's own (a node may carry a `type` key beside its kind)."""

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
