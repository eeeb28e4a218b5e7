"""Numbers and the leaf nodes of a suite: tensors, scalars and constants, with their
dtype, shape, sampling and the integers each dtype holds."""

from __future__ import annotations

import math
from typing import Any, Iterator

from ..core.errors import suggest
from .fields import DTYPES, INITS, INT_RANGES, KINDS, RANDINT_HIGH, SAMPLING_FIELDS, dtype_family
from .problems import BAD, Problems, Where, is_number, plain


def _nested_shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list):
        if not value:
            return (0,)
        shapes = {_nested_shape(v) for v in value}
        inner = shapes.pop() if len(shapes) == 1 else None
        return None if inner is None else (len(value),) + inner
    return () if isinstance(value, (int, float, bool)) else None


def _leaves(value: Any, path: tuple[int, ...] = ()) -> Iterator[tuple[Any, tuple[int, ...]]]:
    """The non-list values of nested lists, each with its index path."""
    if not isinstance(value, list):
        yield value, path
        return
    for i, v in enumerate(value):
        if isinstance(v, list):
            yield from _leaves(v, (*path, i))
        else:
            yield v, (*path, i)


def _leaf_where(value: Any, path: tuple[int, ...], where: Where) -> Where:
    """Where the leaf at `path` of `value` is (made only for a leaf that has a problem)."""
    for i in path:
        where, value = where.at(value, i), value[i]
    return where


class LeafNodes:
    """Validates numbers and the leaf node types into their full plain form."""

    def __init__(self, problems: Problems, dims: dict[str, int]):
        self.problems = problems
        self.dims = dims

    def num(self, raw: Any, where: Where, *, integer: bool = False, minimum: float | None = None,
            maximum: float | None = None) -> Any:
        """A numeric field: number, dim symbol or numeric string."""
        value: Any = raw
        if isinstance(raw, dict) and ("var" in raw or raw.get("type") == "var"):
            return self.problems.add(where, "a template var is not allowed here (only in template "
                                            "args/kwargs and in {ref: {var: ...}}); use a dim symbol")
        if isinstance(raw, str):
            s = raw.strip()
            if s in self.dims:
                value = self.dims[s]
            else:
                try:
                    value = int(s)
                except ValueError:
                    try:
                        value = float(s)
                    except ValueError:
                        return self.problems.add(where, f"'{raw}' is neither a number nor a defined dim"
                                                        f"{suggest(s, self.dims)}; defined dims: "
                                                        f"{', '.join(self.dims) or '(none)'}")
        elif not is_number(raw):
            return self.problems.add(where, f"expected a number or dim symbol, got {type(raw).__name__} {raw!r}")
        if isinstance(value, float) and not math.isfinite(value):
            return self.problems.add(where, f"{raw!r} is not a finite number")
        if integer:
            if isinstance(value, float) and not value.is_integer():
                return self.problems.add(where, f"expected an integer, got {raw!r}")
            value = int(value)
        if minimum is not None and value < minimum:
            return self.problems.add(where, f"{raw!r} must be >= {minimum:g}")
        if maximum is not None and value > maximum:
            return self.problems.add(where, f"{raw!r} must be <= {maximum:g}")
        return value

    # ---- what a leaf holds -----------------------------------------------------------------
    def _dtype(self, raw: dict, where: Where, t: str) -> Any:
        kind, dtype = raw.get("kind"), raw.get("dtype")
        if kind is None and dtype is None:
            return self.problems.add(where, f"'{t}' node needs 'kind' (float, int, bool) or 'dtype'")
        if kind is not None and kind not in KINDS:
            return self.problems.add(where.at(raw, "kind"), f"unknown kind {kind!r}{suggest(kind, KINDS)}; "
                                                            "use float, int or bool")
        if dtype is not None and dtype not in DTYPES:
            return self.problems.add(where.at(raw, "dtype"), f"unknown dtype {dtype!r}{suggest(dtype, DTYPES)}")
        if dtype is None:
            return KINDS[kind or "float"]
        if kind is not None and dtype_family(dtype) not in (kind, "complex" if kind == "float" else kind):
            return self.problems.add(where, f"kind {kind!r} contradicts dtype {dtype!r}; give one of them")
        return dtype

    def _shape(self, raw: dict, where: Where) -> Any:
        shape, w = raw["shape"], where.at(raw, "shape")
        if not isinstance(shape, list) or not shape:
            return self.problems.add(w, f"shape must be a non-empty list of sizes or dim symbols, got {shape!r}")
        out = [self.num(d, w.at(shape, i), integer=True, minimum=0) for i, d in enumerate(shape)]
        return BAD if BAD in out else out

    def _sampling(self, raw: dict, where: Where, dtype: str, allow_grad: bool) -> Any:
        """init + its parameters, defaults filled in; parameters the init ignores are dropped."""
        fam = dtype_family(dtype)
        init = raw.get("init")
        if init is not None and init not in INITS:
            return self.problems.add(where.at(raw, "init"), f"unknown init {init!r}{suggest(init, INITS)}; "
                                                            f"valid: {', '.join(INITS)}")
        if ("low" in raw) != ("high" in raw):
            return self.problems.add(where, "give both 'low' and 'high' (inclusive bounds) or neither")
        if init is None:
            if fam == "bool":
                init = "bernoulli"
            elif "low" in raw:
                init = "randint" if fam == "int" else "uniform"
            else:
                init = "randint" if fam == "int" else "normal"
        out: dict[str, Any] = {"init": init}
        nums = {k: self.num(raw[k], where.at(raw, k), integer=(k in ("low", "high") and init == "randint"))
                for k in ("low", "high", "mean", "std", "p") if k in raw}
        if BAD in nums.values():
            return BAD
        if "p" in nums and not 0 <= nums["p"] <= 1:
            return self.problems.add(where.at(raw, "p"), f"p={nums['p']} must lie in [0, 1]")
        if "std" in nums and nums["std"] < 0:
            return self.problems.add(where.at(raw, "std"), f"std={nums['std']} must be >= 0")
        if "low" in nums and nums["low"] > nums["high"]:
            return self.problems.add(where.at(raw, "low"), f"low={nums['low']} is above high={nums['high']}")
        if init == "randint" and "low" in nums and not (
                self.fits(nums["low"], dtype, where.at(raw, "low"))
                and self.fits(nums["high"], dtype, where.at(raw, "high"), high=RANDINT_HIGH)):
            return BAD
        if init == "normal":
            out.update(mean=float(nums.get("mean", 0.0)), std=float(nums.get("std", 1.0)))
        elif init == "uniform":
            out.update(low=float(nums.get("low", 0.0)), high=float(nums.get("high", 1.0)))
        elif init == "randint":
            out.update(low=int(nums.get("low", 0)), high=int(nums.get("high", 9)))
        elif init == "bernoulli":
            out.update(p=float(nums.get("p", 0.5)))
        grad = raw.get("requires_grad", False)
        if not isinstance(grad, bool):
            return self.problems.add(where.at(raw, "requires_grad"), f"requires_grad must be true or false, "
                                                                     f"got {grad!r}")
        if grad and fam in ("int", "bool"):
            return self.problems.add(where.at(raw, "requires_grad"), f"requires_grad needs a floating or "
                                                                     f"complex dtype, not {dtype}")
        if allow_grad:
            out["requires_grad"] = grad
        return out

    def fits(self, value: int, dtype: str, where: Where, high: int | None = None) -> bool:
        """Whether an integer lies in what `dtype` holds (int64 for a non-integer dtype:
        what torch makes of a Python int), and at most `high`; a problem naming the field
        when not."""
        lo, hi = INT_RANGES.get(dtype, INT_RANGES["int64"])
        name = dtype if dtype in INT_RANGES else "int64"
        if lo <= value <= hi and (high is None or value <= high):
            return True
        if lo <= value <= hi:
            self.problems.add(where, f"{value} is too large: at most {high} (randint draws int64 values "
                                     "below high + 1)")
        else:
            self.problems.add(where, f"{value} does not fit {name} (which holds {lo} to {hi}); give a value "
                                     "in that range")
        return False

    def _literal_ok(self, value: Any, dtype: str, where: Where) -> bool:
        fam = dtype_family(dtype)
        for v, path in _leaves(value):
            if fam == "bool" and not isinstance(v, bool) or fam == "int" and not (
                    isinstance(v, int) and not isinstance(v, bool)) or fam in ("float", "complex") and not (
                    is_number(v)):
                self.problems.add(where, f"value {v!r} does not fit dtype {dtype}")
                return False
            if fam == "int" and not self.fits(v, dtype, _leaf_where(value, path, where)):
                return False
        return True

    # ---- the leaf node types: (raw, where, env, arg) -> the resolved node, or BAD ------------
    def tensor_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        shape, dtype = self._shape(raw, where), self._dtype(raw, where, "tensor")
        if BAD in (shape, dtype):
            return BAD
        s = self._sampling(raw, where, dtype, allow_grad=True)
        return BAD if s is BAD else {"type": "tensor", "shape": shape, "dtype": dtype, **s}

    def scalar_tensor_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        dtype = self._dtype(raw, where, "scalar_tensor")
        if dtype is BAD:
            return BAD
        if "value" in raw:
            extra = [k for k in SAMPLING_FIELDS if k in raw]
            if extra:
                return self.problems.add(where, f"give 'value' or sampling fields ({', '.join(extra)}), not both")
            v = raw["value"]
            if isinstance(v, list) or not self._literal_ok(v, dtype, where.at(raw, "value")):
                return self.problems.add(where.at(raw, "value"), f"value must be one number or bool, got {v!r}") \
                    if isinstance(v, list) else BAD
            return {"type": "scalar_tensor", "dtype": dtype, "value": v,
                    "requires_grad": bool(raw.get("requires_grad", False))}
        s = self._sampling(raw, where, dtype, allow_grad=True)
        return BAD if s is BAD else {"type": "scalar_tensor", "dtype": dtype, **s}

    def const_tensor_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        shape, dtype = self._shape(raw, where), self._dtype(raw, where, "const_tensor")
        if BAD in (shape, dtype):
            return BAD
        if "value" in raw:
            extra = [k for k in SAMPLING_FIELDS if k in raw]
            if extra:
                return self.problems.add(where, f"give 'value' or sampling fields ({', '.join(extra)}), not both")
            value = plain(raw["value"], where.at(raw, "value"), self.problems)
            if value is BAD:
                return BAD
            got = _nested_shape(value)
            if got != tuple(shape) and not (value == [] and 0 in shape):   # [] fills any empty shape
                return self.problems.add(where.at(raw, "value"), f"value has shape {list(got) if got else '?'}"
                                                                 f" but shape is {shape}")
            if not self._literal_ok(raw["value"], dtype, where.at(raw, "value")):   # raw: with positions
                return BAD
            return {"type": "const_tensor", "shape": shape, "dtype": dtype, "value": value}
        s = self._sampling(raw, where, dtype, allow_grad=False)
        return BAD if s is BAD else {"type": "const_tensor", "shape": shape, "dtype": dtype, **s}

    def scalar_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        dtype = self._dtype(raw, where, "scalar")
        if dtype is BAD:
            return BAD
        fam = dtype_family(dtype)
        if fam == "complex":
            return self.problems.add(where.at(raw, "dtype"), "a scalar cannot be complex")
        out: dict[str, Any] = {"type": "scalar", "dtype": dtype}
        if "value" in raw:
            extra = [k for k in ("low", "high", "p") if k in raw]
            if extra:
                return self.problems.add(where, f"give 'value' or {'/'.join(extra)}, not both")
            v = raw["value"]
            if isinstance(v, list) or not self._literal_ok(v, dtype, where.at(raw, "value")):
                return BAD if not isinstance(v, list) else self.problems.add(where.at(raw, "value"),
                                                                             "value must be one number or bool")
            out["value"] = float(v) if fam == "float" else v
            return out
        if fam == "bool":
            for k in ("low", "high"):
                if k in raw:
                    return self.problems.add(where.at(raw, k), f"'{k}' is for numeric scalars; a bool scalar takes p")
            p = self.num(raw.get("p", 0.5), where.at(raw, "p"), minimum=0, maximum=1)
            return BAD if p is BAD else {**out, "p": float(p)}
        if "p" in raw:
            return self.problems.add(where.at(raw, "p"), "'p' is only for bool scalars")
        if ("low" in raw) != ("high" in raw):
            return self.problems.add(where, "give both 'low' and 'high' or neither")
        integer = fam == "int"
        low = self.num(raw.get("low", 0), where.at(raw, "low"), integer=integer)
        high = self.num(raw.get("high", 9 if integer else 1), where.at(raw, "high"), integer=integer)
        if BAD in (low, high):
            return BAD
        if low >= high:
            return self.problems.add(where.at(raw, "low"), f"low={low} must be below high={high}")
        if integer and not (self.fits(low, "int64", where.at(raw, "low"))
                            and self.fits(high, "int64", where.at(raw, "high"), high=RANDINT_HIGH)):
            return BAD
        return {**out, "low": low if integer else float(low), "high": high if integer else float(high)}

    def const_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        value = plain(raw["value"], where.at(raw, "value"), self.problems)
        return BAD if value is BAD else {"type": "const", "value": value}

    def int_list_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        elems, w = raw["elems"], where.at(raw, "elems")
        if not isinstance(elems, list) or not elems:
            return self.problems.add(w, f"elems must be a non-empty list of ints, got {elems!r}")
        out = [self.num(e, w.at(elems, i), integer=True) for i, e in enumerate(elems)]
        if BAD in out or not all([self.fits(e, "int64", w.at(elems, i)) for i, e in enumerate(out)]):
            return BAD
        return {"type": "int_list", "elems": out}

