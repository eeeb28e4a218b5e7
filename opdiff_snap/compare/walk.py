"""Walking an expected and an actual output in step: one pair of tensors per leaf, or
the first place their structure differs."""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

import numpy as np
import torch


class StructureDiffers(Exception):
    """Where two outputs first differ in structure, and how."""


def _to_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return None


def _number_kind(x: Any) -> str | None:
    if isinstance(x, (bool, np.bool_)):
        return "bool"
    if isinstance(x, (int, np.integer)):
        return "int"
    if isinstance(x, (float, np.floating)):
        return "float"
    if isinstance(x, (complex, np.complexfloating)):
        return "complex"
    return None


def _kind(x: Any) -> str:
    return type(x).__name__


def _subtree(tree: Any, key: Any) -> Any:
    """The subtree at `key` (None when the tree does not go there)."""
    try:
        if isinstance(tree, Mapping):
            return tree.get(key)
        if isinstance(tree, (tuple, list)):
            return tree[key]
    except (IndexError, TypeError):
        pass
    return None


def _child(aux: tuple[Any, ...], key: Any) -> tuple[Any, ...]:
    """The subtrees at `key` of each tree nested like the outputs (compare.rules.Rounding:
    residuals, elementwise reference, precision control)."""
    return tuple(_subtree(tree, key) for tree in aux)


def _tensor_or_none(x: Any) -> torch.Tensor | None:
    return x if isinstance(x, torch.Tensor) else None


LeafPair = tuple[str, torch.Tensor, torch.Tensor, "tuple[torch.Tensor | None, ...]"]


def leaf_pairs(e: Any, a: Any, path: str, res: tuple[Any, ...] = (None, None, None)) -> Iterator[LeafPair]:
    """(path, expected, actual, the leaf of each tree in `res`) per tensor/number leaf;
    raises StructureDiffers at the first structural difference."""
    te, ta = _to_tensor(e), _to_tensor(a)
    if te is not None or ta is not None:
        if te is None or ta is None:
            raise StructureDiffers(f"{path}: expected {'a tensor' if te is not None else _kind(e)}, "
                             f"got {'a tensor' if ta is not None else _kind(a)}")
        yield path, te, ta, tuple(_tensor_or_none(tree) for tree in res)
        return
    if isinstance(e, (tuple, list)) or isinstance(a, (tuple, list)):
        if not (isinstance(e, (tuple, list)) and isinstance(a, (tuple, list))):
            raise StructureDiffers(f"{path}: expected {_kind(e)}, got {_kind(a)}")
        if len(e) != len(a):
            raise StructureDiffers(f"{path}: expected {len(e)} elements, got {len(a)}")
        for i, (ei, ai) in enumerate(zip(e, a)):
            yield from leaf_pairs(ei, ai, f"{path}[{i}]", _child(res, i))
        return
    if isinstance(e, Mapping) or isinstance(a, Mapping):
        if not (isinstance(e, Mapping) and isinstance(a, Mapping)):
            raise StructureDiffers(f"{path}: expected {_kind(e)}, got {_kind(a)}")
        missing = [k for k in e if k not in a]
        extra = [k for k in a if k not in e]
        if missing or extra:
            parts = ([f"missing keys {missing!r}"] if missing else []) + \
                    ([f"unexpected keys {extra!r}"] if extra else [])
            raise StructureDiffers(f"{path}: {', '.join(parts)}")
        for k in e:
            yield from leaf_pairs(e[k], a[k], f"{path}[{k!r}]", _child(res, k))
        return
    none = (None,) * len(res)
    ke, ka = _number_kind(e), _number_kind(a)
    if ke is not None and ka is not None:
        if (ke == "bool") != (ka == "bool") or (ke == "complex") != (ka == "complex"):
            raise StructureDiffers(f"{path}: expected {_kind(e)} {e!r}, got {_kind(a)} {a!r}")
        if ke == ka == "bool":
            yield path, torch.tensor(bool(e)), torch.tensor(bool(a)), none
        elif ke == ka == "int":
            yield path, torch.tensor(int(e), dtype=torch.int64), torch.tensor(int(a), dtype=torch.int64), none
        elif ke == "complex":
            yield path, torch.tensor(complex(e), dtype=torch.complex128), \
                torch.tensor(complex(a), dtype=torch.complex128), none
        else:  # float vs float, or int vs float: numeric compare under the tolerance. A Python
            # float leaves a backend as a float32 tensor (torch's default dtype), so it is held
            # to the float32 rule, not to float64's tighter one.
            wide = any(math.isfinite(float(v)) and abs(float(v)) > 3.0e38 for v in (e, a))
            dtype = torch.float64 if wide else torch.float32
            yield path, torch.tensor(float(e), dtype=dtype), torch.tensor(float(a), dtype=dtype), none
        return
    if type(e) is not type(a) or e != a:
        raise StructureDiffers(f"{path}: expected {e!r}, got {a!r}")

