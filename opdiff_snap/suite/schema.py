"""Field specs of the suite format, and validation of everything but the document
structure: nodes (resolved to their full plain-JSON form) and our test extensions.

Every check records a `Problem` and goes on, so one pass finds every problem;
a node that failed resolves to `BAD`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..core.errors import OpdiffError, Problem, suggest
from .yamlload import Mark, child_mark, key_mark

if TYPE_CHECKING:
    from .files import SearchRoots

TOP_KEYS = ("include", "dims", "presets", "tests", "defaults")
EXTENSION_KEYS = ("tolerance", "seeds", "tags", "skip", "grad")
TOLERANCE_KEYS = ("atol", "rtol", "baseline_factor")
TEST_KEYS = ("id", "op", "in", "kwargs", "out", "impl", "device", "cast_input0_to_complex") + EXTENSION_KEYS
DEVICES = ("cpu", "gpu", "cuda", "mps")
PRECISIONS = ("fp32", "fp16", "bf16")

KINDS = {"float": "float32", "int": "int64", "bool": "bool"}
DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "bool", "complex64", "complex128")
INITS = ("normal", "uniform", "randint", "zeros", "ones", "bernoulli")
# the integers each integer dtype holds; a Python int given to torch becomes an int64
INT_RANGES = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
              "int64": (-2**63, 2**63 - 1), "uint8": (0, 2**8 - 1)}
RANDINT_HIGH = 2**63 - 2   # randint draws int64 values below high + 1, which must be an int64 too
_SAMPLING = ("init", "low", "high", "mean", "std", "p")

NODE_FIELDS: dict[str, tuple[str, ...]] = {
    "tensor": ("shape", "kind", "dtype", "init", "low", "high", "mean", "std", "p", "requires_grad"),
    "scalar": ("kind", "dtype", "value", "low", "high", "p"),
    "scalar_tensor": ("kind", "dtype", "value", "init", "low", "high", "mean", "std", "p", "requires_grad"),
    "const": ("value",),
    "const_tensor": ("shape", "kind", "dtype", "value", "init", "low", "high", "mean", "std", "p"),
    "int_list": ("elems",),
    "list": ("len", "elem"),
    "tuple": ("elems",),
    "optional": ("elem", "p_none"),
    "ref": ("ref",),
    "var": ("name",),
    "module": ("path", "args", "kwargs", "config"),
    "construct": ("path", "args", "kwargs", "config"),
    "template_module": ("path", "vars", "cases", "args", "kwargs", "config"),
    "template_compare_pair": ("vars", "cases", "common", "a", "b"),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "tensor": ("shape",), "const": ("value",), "const_tensor": ("shape",), "int_list": ("elems",),
    "list": ("len", "elem"), "tuple": ("elems",), "optional": ("elem",), "ref": ("ref",),
    "var": ("name",), "module": ("path",), "construct": ("path",), "template_module": ("path",),
    "template_compare_pair": ("a", "b"),
}
SIDE_FIELDS = ("impl", "type", "path", "args", "kwargs", "config")
OP_NODE_TYPES = ("module", "template_module", "template_compare_pair")
VALUE_NODE_TYPES = tuple(t for t in NODE_FIELDS if t not in OP_NODE_TYPES + ("var",))

BAD: Any = type("Bad", (), {"__repr__": lambda self: "BAD"})()  # a value that failed validation


def dtype_family(dtype: str) -> str:
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("complex"):
        return "complex"
    return "float"


@dataclass(frozen=True)
class Where:
    """A location in a suite: file, field path, YAML position and (when known) test id."""

    file: str
    field: str = ""
    mark: Mark = None
    test_id: str = ""

    def at(self, container: Any, key: Any) -> "Where":
        return replace(self, field=self._join(key), mark=child_mark(container, key, self.mark))

    def key(self, container: Any, key: Any) -> "Where":
        return replace(self, field=self._join(key), mark=key_mark(container, key, self.mark))

    def _join(self, key: Any) -> str:
        if isinstance(key, int):
            return f"{self.field}[{key}]"
        return f"{self.field}.{key}" if self.field else str(key)


class Problems:
    """Ordered, de-duplicated problems (template expansion meets the same one repeatedly)."""

    def __init__(self) -> None:
        self._items: dict[Problem, None] = {}

    def add(self, where: Where, message: str) -> Any:
        line, col = where.mark if where.mark else (None, None)
        self._items[Problem(file=where.file, message=message, field=where.field,
                            test_id=where.test_id, line=line, column=col)] = None
        return BAD

    def extend(self, problems: Iterable[Problem]) -> None:
        for p in problems:
            self._items[p] = None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)


def check_keys(m: dict, allowed: Iterable[str], where: Where, problems: Problems, what: str) -> None:
    allowed = tuple(allowed)
    for k in m:
        if k not in allowed:
            problems.add(where.key(m, k), f"unknown key '{k}' in {what}{suggest(k, allowed)}; "
                                          f"valid keys: {', '.join(allowed)}")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def plain(x: Any, where: Where, problems: Problems) -> Any:
    """A YAML literal as plain JSON (dict/list/str/number/bool/None)."""
    if isinstance(x, dict):
        return {str(k): plain(v, where.at(x, k), problems) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v, where.at(x, i), problems) for i, v in enumerate(x)]
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    return problems.add(where, f"{type(x).__name__} value {x!r} is not allowed here; quote it as a string")


def _nested_shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list):
        if not value:
            return (0,)
        shapes = {_nested_shape(v) for v in value}
        inner = shapes.pop() if len(shapes) == 1 else None
        return None if inner is None else (len(value),) + inner
    return () if isinstance(value, (int, float, bool)) else None


class NodeResolver:
    """Validates nodes and resolves refs, dims and vars into their full plain form.

    `preset(name, where)` returns a preset's resolved node (BAD if it failed);
    `check_path(path, where, module)` validates a dotted or `file:` path.
    """

    def __init__(self, problems: Problems, dims: dict[str, int], preset_names: Iterable[str],
                 preset: Callable[[str, Where], Any], check_path: Callable[[Any, Where, bool], Any]):
        self.problems = problems
        self.dims = dims
        self.preset_names = list(preset_names)
        self.preset = preset
        self.check_path = check_path

    # ---- numbers -----------------------------------------------------------------------
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

    # ---- node entry points ---------------------------------------------------------------
    def node_type(self, raw: dict, where: Where) -> Any:
        if "type" in raw:
            t = raw["type"]
            if t not in NODE_FIELDS:
                return self.problems.add(where.at(raw, "type"), f"unknown node type {t!r}"
                                                                f"{suggest(t, NODE_FIELDS)}")
            return t
        if len(raw) == 1 and "ref" in raw:
            return "ref"
        if len(raw) == 1 and "var" in raw:
            return "var"
        return self.problems.add(where, "a node needs a 'type' (or is written {ref: name} or {var: name}); "
                                        f"got keys {', '.join(map(str, raw)) or '(none)'}")

    def value(self, raw: Any, where: Where, env: dict | None = None) -> Any:
        """An input-like node (in, kwargs, out, presets)."""
        if not isinstance(raw, dict):
            return self.problems.add(where, f"expected a node (a mapping with 'type'), got {raw!r}; "
                                            "write literals as {type: const, value: ...}")
        t = self.node_type(raw, where)
        if t is BAD:
            return BAD
        if t == "var":
            return self.problems.add(where, "a template var is only allowed in template args/kwargs "
                                            "and as {ref: {var: ...}}")
        if t in OP_NODE_TYPES:
            return self.problems.add(where, f"a '{t}' node belongs in a test's 'op', not here")
        return self._node(t, raw, where, env, arg=False)

    def arg(self, raw: Any, where: Where, env: dict | None) -> Any:
        """A constructor argument: a node or a literal (literals become const nodes)."""
        if isinstance(raw, dict):
            t = self.node_type(raw, where) if ("type" in raw or len(raw) == 1 and
                                               ("ref" in raw or "var" in raw)) else None
            if t is BAD:
                return BAD
            if t is None:  # a literal mapping, possibly holding vars
                items = {str(k): self.arg(v, where.at(raw, k), env) for k, v in raw.items()}
                return self._literal_container(items, where)
            if t == "var":
                return self._var(raw, where, env)
            if t in OP_NODE_TYPES:
                return self.problems.add(where, f"a '{t}' node cannot be a constructor argument; "
                                                "use {type: construct, ...}")
            return self._node(t, raw, where, env, arg=True)
        if isinstance(raw, list):
            elems = [self.arg(v, where.at(raw, i), env) for i, v in enumerate(raw)]
            if any(e is BAD for e in elems):
                return BAD
            if all(e["type"] == "const" for e in elems):
                return {"type": "const", "value": [e["value"] for e in elems]}
            return {"type": "tuple", "elems": elems}
        value = plain(raw, where, self.problems)
        return BAD if value is BAD else {"type": "const", "value": value}

    def _literal_container(self, items: dict, where: Where) -> Any:
        if any(v is BAD for v in items.values()):
            return BAD
        if all(v["type"] == "const" for v in items.values()):
            return {"type": "const", "value": {k: v["value"] for k, v in items.items()}}
        return self.problems.add(where, "a literal mapping in constructor args may hold only literals; "
                                        "build objects with {type: construct, ...}")

    def _var(self, raw: dict, where: Where, env: dict | None) -> Any:
        name = raw.get("var", raw.get("name"))
        check_keys(raw, ("type", "name") if "type" in raw else ("var",), where, self.problems, "a var node")
        if env is None:
            return self.problems.add(where, f"var '{name}' used outside a template_module / "
                                            "template_compare_pair")
        if not isinstance(name, str) or name not in env:
            return self.problems.add(where, f"undefined template var {name!r}{suggest(str(name), env)}; "
                                            f"declared vars: {', '.join(env) or '(none)'}")
        value = env[name]
        if isinstance(value, str) and value in self.dims:
            return {"type": "const", "value": self.dims[value]}
        return self.arg(value, where, None)

    # ---- the node types ------------------------------------------------------------------
    def _node(self, t: str, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        if t == "ref" and "type" not in raw:
            pass
        else:
            check_keys(raw, ("type",) + NODE_FIELDS[t], where, self.problems, f"a '{t}' node")
        missing = [f for f in REQUIRED.get(t, ()) if f not in raw]
        for f in missing:
            self.problems.add(where, f"'{t}' node is missing required field '{f}'")
        if missing:
            return BAD
        return getattr(self, "_n_" + t)(raw, where, env, arg)

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
        leaves: list[tuple[Any, Where]] = []

        def walk(v: Any, w: Where) -> None:
            if isinstance(v, list):
                for i, x in enumerate(v):
                    walk(x, w.at(v, i))
            else:
                leaves.append((v, w))
        walk(value, where)
        for v, w in leaves:
            if fam == "bool" and not isinstance(v, bool) or fam == "int" and not (
                    isinstance(v, int) and not isinstance(v, bool)) or fam in ("float", "complex") and not (
                    is_number(v)):
                self.problems.add(where, f"value {v!r} does not fit dtype {dtype}")
                return False
            if fam == "int" and not self.fits(v, dtype, w):
                return False
        return True

    def _n_tensor(self, raw, where, env, arg):
        shape, dtype = self._shape(raw, where), self._dtype(raw, where, "tensor")
        if BAD in (shape, dtype):
            return BAD
        s = self._sampling(raw, where, dtype, allow_grad=True)
        return BAD if s is BAD else {"type": "tensor", "shape": shape, "dtype": dtype, **s}

    def _n_scalar_tensor(self, raw, where, env, arg):
        dtype = self._dtype(raw, where, "scalar_tensor")
        if dtype is BAD:
            return BAD
        if "value" in raw:
            extra = [k for k in _SAMPLING if k in raw]
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

    def _n_const_tensor(self, raw, where, env, arg):
        shape, dtype = self._shape(raw, where), self._dtype(raw, where, "const_tensor")
        if BAD in (shape, dtype):
            return BAD
        if "value" in raw:
            extra = [k for k in _SAMPLING if k in raw]
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

    def _n_scalar(self, raw, where, env, arg):
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

    def _n_const(self, raw, where, env, arg):
        value = plain(raw["value"], where.at(raw, "value"), self.problems)
        return BAD if value is BAD else {"type": "const", "value": value}

    def _n_int_list(self, raw, where, env, arg):
        elems, w = raw["elems"], where.at(raw, "elems")
        if not isinstance(elems, list) or not elems:
            return self.problems.add(w, f"elems must be a non-empty list of ints, got {elems!r}")
        out = [self.num(e, w.at(elems, i), integer=True) for i, e in enumerate(elems)]
        if BAD in out or not all([self.fits(e, "int64", w.at(elems, i)) for i, e in enumerate(out)]):
            return BAD
        return {"type": "int_list", "elems": out}

    def _n_list(self, raw, where, env, arg):
        n = self.num(raw["len"], where.at(raw, "len"), integer=True, minimum=0)
        elem = self._sub(raw["elem"], where.at(raw, "elem"), env, arg)
        return BAD if BAD in (n, elem) else {"type": "list", "len": n, "elem": elem}

    def _n_tuple(self, raw, where, env, arg):
        elems, w = raw["elems"], where.at(raw, "elems")
        if not isinstance(elems, list):
            return self.problems.add(w, f"elems must be a list of nodes, got {elems!r}")
        out = [self._sub(e, w.at(elems, i), env, arg) for i, e in enumerate(elems)]
        return BAD if BAD in out else {"type": "tuple", "elems": out}

    def _n_optional(self, raw, where, env, arg):
        p = self.num(raw.get("p_none", 0), where.at(raw, "p_none"), minimum=0, maximum=1)
        elem = self._sub(raw["elem"], where.at(raw, "elem"), env, arg)
        return BAD if BAD in (p, elem) else {"type": "optional", "p_none": float(p), "elem": elem}

    def _sub(self, raw: Any, where: Where, env: dict | None, arg: bool) -> Any:
        return self.arg(raw, where, env) if arg else self.value(raw, where, env)

    def _n_ref(self, raw, where, env, arg):
        ref, w = raw["ref"], where.at(raw, "ref")
        if isinstance(ref, dict):
            if not (ref.keys() == {"var"} or ref.get("type") == "var"):
                return self.problems.add(w, "ref must be a preset name or {var: name}")
            name = ref.get("var", ref.get("name"))
            if env is None:
                return self.problems.add(w, f"ref var '{name}' used outside a template")
            if name not in env:
                return self.problems.add(w, f"undefined template var {name!r}{suggest(name, env)}; "
                                            f"declared vars: {', '.join(env) or '(none)'}")
            ref = env[name]
            if not isinstance(ref, str):
                return self.problems.add(w, f"template var '{name}' = {ref!r} must name a preset")
        if not isinstance(ref, str):
            return self.problems.add(w, f"ref must be a preset name, got {ref!r}")
        if ref not in self.preset_names:
            return self.problems.add(w, f"undefined preset '{ref}'{suggest(ref, self.preset_names)}")
        return self.preset(ref, w)

    def _n_var(self, raw, where, env, arg):  # reached only through value(); kept for completeness
        return self.problems.add(where, "a var node is not allowed here")

    def _ctor(self, t: str, raw: dict, where: Where, env: dict | None) -> Any:
        path = self.check_path(raw["path"], where.at(raw, "path"), t == "module")
        args, kwargs = self.ctor_args(raw, where, env)
        config = self.config(raw["config"], where.at(raw, "config"), env) if "config" in raw else None
        if BAD in (path, args, kwargs, config):
            return BAD
        node = {"type": t, "path": path, "args": args, "kwargs": kwargs}
        return node if config is None else {**node, "config": config}

    def config(self, raw: Any, where: Where, env: dict | None) -> Any:
        """A `config` mapping (suite/fromconfig.py): setting names to plain YAML values,
        template vars resolved; BAD after recording what is wrong."""
        if not isinstance(raw, dict):
            return self.problems.add(where, f"config must map setting names to values, e.g. {{n_layer: 2}}, "
                                            f"got {raw!r}")
        out = {}
        for k, v in raw.items():
            if not isinstance(k, str) or not k.isidentifier():
                out[str(k)] = self.problems.add(where.key(raw, k), f"config key {k!r} is not a setting name "
                                                                   "(a Python identifier)")
            else:
                out[k] = self._setting(v, where.at(raw, k), env)
        return BAD if BAD in out.values() else out

    def _setting(self, raw: Any, where: Where, env: dict | None) -> Any:
        if isinstance(raw, dict) and set(raw) == {"var"}:
            node = self._var(raw, where, env)
            if node is BAD or node["type"] == "const":
                return node if node is BAD else node["value"]
            return self.problems.add(where, f"template var '{raw['var']}' must hold a plain value here")
        if isinstance(raw, (dict, list)):
            items = raw.items() if isinstance(raw, dict) else enumerate(raw)
            out = {k: self._setting(v, where.at(raw, k), env) for k, v in items}
            if BAD in out.values():
                return BAD
            return {str(k): v for k, v in out.items()} if isinstance(raw, dict) else list(out.values())
        if isinstance(raw, float) and not math.isfinite(raw):
            return self.problems.add(where, f"{raw!r} is not a finite number")
        if isinstance(raw, str) and _FLOATISH.match(raw):
            return self.problems.add(where, f"'{raw}' reads as a string: YAML 1.1 wants a dot and a signed "
                                            f"exponent in a float, so write {_yaml_float(raw)} for the number")
        return plain(raw, where, self.problems)

    def ctor_args(self, raw: dict, where: Where, env: dict | None) -> tuple[Any, Any]:
        args = self.args_list(raw.get("args"), where.at(raw, "args"), env)
        kwargs = raw.get("kwargs") or {}
        wk = where.at(raw, "kwargs")
        if not isinstance(kwargs, dict):
            return args, self.problems.add(wk, f"kwargs must be a mapping, got {kwargs!r}")
        return args, self.kwargs_map([(k, v, wk.at(kwargs, k)) for k, v in kwargs.items()], env)

    def args_list(self, args: Any, where: Where, env: dict | None) -> Any:
        if args is None:
            return []
        if not isinstance(args, list):
            return self.problems.add(where, f"args must be a list, got {args!r}")
        out = [self.arg(a, where.at(args, i), env) for i, a in enumerate(args)]
        return BAD if BAD in out else out

    def kwargs_map(self, items: list[tuple[Any, Any, Where]], env: dict | None) -> Any:
        out = {str(k): self.arg(v, w, env) for k, v, w in items}
        return BAD if BAD in out.values() else out

    def _n_construct(self, raw, where, env, arg):
        return self._ctor("construct", raw, where, env)

    def _n_module(self, raw, where, env, arg):
        return self._ctor("module", raw, where, env)


_FLOATISH = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _yaml_float(text: str) -> str:
    """'1e-5' -> '1.0e-5', '2.5e3' -> '2.5e+3': how YAML 1.1 spells that float."""
    mantissa, _, exponent = text.lower().partition("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent if exponent[0] in '+-' else '+' + exponent}"


# ---- our extensions ---------------------------------------------------------------------

_KEY_RE = re.compile(r"^[A-Za-z0-9_.*?\[\]-]+$")


def _tol_pair(raw: Any, where: Where, problems: Problems, num: Callable) -> Any:
    if not isinstance(raw, dict):
        return problems.add(where, f"expected {{atol: ..., rtol: ...}}, got {raw!r}")
    check_keys(raw, TOLERANCE_KEYS, where, problems, "a tolerance")
    if not raw or any(k not in TOLERANCE_KEYS for k in raw):
        return BAD if raw else problems.add(where, "a tolerance needs atol, rtol and/or baseline_factor")
    vals = {k: num(raw[k], where.at(raw, k), minimum=0) for k in TOLERANCE_KEYS if k in raw}
    if BAD in vals.values():
        return BAD
    out = {"atol": float(vals["atol"]) if "atol" in vals else None,
           "rtol": float(vals["rtol"]) if "rtol" in vals else None}
    if "baseline_factor" in vals:  # only when given: definitions (and spec hashes) stay as they were
        out["baseline_factor"] = float(vals["baseline_factor"])
    return out


def parse_extension(key: str, raw: Any, where: Where, problems: Problems,
                    num: Callable) -> Any:
    """Validate one extension field; returns its canonical JSON form or BAD."""
    if key == "tolerance":
        if isinstance(raw, dict) and raw and set(raw) <= set(TOLERANCE_KEYS):
            t = _tol_pair(raw, where, problems, num)
            return BAD if t is BAD else {"*": t}
        if not isinstance(raw, dict) or not raw:
            return problems.add(where, "tolerance must be {atol, rtol} or a mapping of precision "
                                       f"({', '.join(PRECISIONS)}), preset name or glob to {{atol, rtol}}")
        out = {}
        for k, v in raw.items():
            if not isinstance(k, str) or not _KEY_RE.match(k):
                problems.add(where.key(raw, k), f"{k!r} is not a precision, preset name or glob")
                continue
            out[k] = _tol_pair(v, where.at(raw, k), problems, num)
        return BAD if BAD in out.values() or len(out) != len(raw) else out
    if key == "seeds":
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw < 1:
                return problems.add(where, f"seeds={raw}: give a positive count or a list of seeds")
            return list(range(raw))
        if isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                 for s in raw):
            if len(set(raw)) != len(raw):
                return problems.add(where, f"seeds {raw} repeat a seed")
            return list(raw)
        return problems.add(where, f"seeds must be a positive count or a non-empty list of "
                                   f"non-negative ints, got {raw!r}")
    if key == "tags":
        if isinstance(raw, list) and all(isinstance(t, str) and t for t in raw):
            return list(raw)
        return problems.add(where, f"tags must be a list of strings, got {raw!r}")
    if key == "skip":
        if isinstance(raw, dict) and all(isinstance(k, str) and _KEY_RE.match(k) and isinstance(v, str) and v
                                         for k, v in raw.items()):
            return dict(raw)
        return problems.add(where, "skip must map a preset name or glob to a reason string, e.g. "
                                   "{coreml_*: 'complex not supported'}")
    if key == "grad":
        if isinstance(raw, bool):
            return raw
        return problems.add(where, f"grad must be true or false, got {raw!r}")
    raise KeyError(key)


def path_checker(problems: Problems, suite_dir: Path, cache: dict,
                 roots: "SearchRoots", locate: bool = True) -> Callable[[Any, Where, bool], Any]:
    """A `check_path` for NodeResolver: finds `file:` modules (see files.py) and what each
    path names without importing user code (see locate.py); returns the canonical path.
    With `locate=False` a dotted path is taken as written (torch's are not imported)."""
    from .files import display_path, find_file, split_file_path
    from .locate import NotFound, locate_dotted, locate_in_file, problem

    def check(path: Any, where: Where, module: bool) -> Any:
        if not isinstance(path, str) or not path:
            return problems.add(where, f"path must be a dotted import path or file:rel/file.py::Name, "
                                       f"got {path!r}")
        key = (path, str(suite_dir), module)
        if key not in cache:
            try:
                if path.startswith("file:"):
                    rel, name = split_file_path(path)
                    found = find_file(rel, suite_dir, roots)
                    canon = f"file:{Path(os.path.relpath(found, os.path.abspath(suite_dir))).as_posix()}::{name}"
                    cache[key] = (problem(locate_in_file(found, name, display_path(found)), path, module), canon)
                elif not locate:
                    cache[key] = (None, path)
                else:
                    cache[key] = (problem(locate_dotted(path), path, module), path)
            except (OpdiffError, NotFound) as exc:
                cache[key] = (str(exc), path)
        error, canon = cache[key]
        if error is not None:
            return problems.add(where, error)
        return canon
    return check
