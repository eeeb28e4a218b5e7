"""Node resolution: validates the nodes of a suite and resolves refs, dims and vars into
their full plain form, dispatching each node type to its handler."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..core.errors import OpdiffError, suggest
from .fields import NODE_FIELDS, OP_NODE_TYPES, REQUIRED
from .leaves import LeafNodes
from .problems import BAD, Problems, Where, check_keys, plain

if TYPE_CHECKING:
    from .files import SearchRoots


class NodeResolver(LeafNodes):
    """Validates nodes and resolves refs, dims and vars into their full plain form.

    `preset(name, where)` returns a preset's resolved node (BAD if it failed);
    `check_path(path, where, module)` validates a dotted or `file:` path.
    """

    def __init__(self, problems: Problems, dims: dict[str, int], preset_names: Iterable[str],
                 preset: Callable[[str, Where], Any], check_path: Callable[[Any, Where, bool], Any]):
        super().__init__(problems, dims)
        self.preset_names = list(preset_names)
        self.preset = preset
        self.check_path = check_path

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

    # ---- dispatch, and the container, reference and constructor node types ---------------
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
        return NODE_HANDLERS[t](self, raw, where, env, arg)

    def list_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        n = self.num(raw["len"], where.at(raw, "len"), integer=True, minimum=0)
        elem = self._sub(raw["elem"], where.at(raw, "elem"), env, arg)
        return BAD if BAD in (n, elem) else {"type": "list", "len": n, "elem": elem}

    def tuple_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        elems, w = raw["elems"], where.at(raw, "elems")
        if not isinstance(elems, list):
            return self.problems.add(w, f"elems must be a list of nodes, got {elems!r}")
        out = [self._sub(e, w.at(elems, i), env, arg) for i, e in enumerate(elems)]
        return BAD if BAD in out else {"type": "tuple", "elems": out}

    def optional_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        p = self.num(raw.get("p_none", 0), where.at(raw, "p_none"), minimum=0, maximum=1)
        elem = self._sub(raw["elem"], where.at(raw, "elem"), env, arg)
        return BAD if BAD in (p, elem) else {"type": "optional", "p_none": float(p), "elem": elem}

    def _sub(self, raw: Any, where: Where, env: dict | None, arg: bool) -> Any:
        return self.arg(raw, where, env) if arg else self.value(raw, where, env)

    def ref_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        ref, w = raw["ref"], where.at(raw, "ref")
        if isinstance(ref, dict):
            if not (ref.keys() == {"var"} or ref.get("type") == "var"):
                return self.problems.add(w, "ref must be a preset name or {var: name}")
            name = ref.get("var", ref.get("name"))
            if env is None:
                return self.problems.add(w, f"ref var '{name}' used outside a template")
            if name not in env:
                return self.problems.add(w, f"undefined template var {name!r}{suggest(str(name), env)}; "
                                            f"declared vars: {', '.join(env) or '(none)'}")
            ref = env[name]
            if not isinstance(ref, str):
                return self.problems.add(w, f"template var '{name}' = {ref!r} must name a preset")
        if not isinstance(ref, str):
            return self.problems.add(w, f"ref must be a preset name, got {ref!r}")
        if ref not in self.preset_names:
            return self.problems.add(w, f"undefined preset '{ref}'{suggest(ref, self.preset_names)}")
        return self.preset(ref, w)

    def construct_node(self, raw: dict, where: Where, env: dict | None, arg: bool) -> Any:
        path = self.check_path(raw["path"], where.at(raw, "path"), False)
        args, kwargs = self.ctor_args(raw, where, env)
        config = self.config(raw["config"], where.at(raw, "config"), env) if "config" in raw else None
        if BAD in (path, args, kwargs, config):
            return BAD
        node = {"type": "construct", "path": path, "args": args, "kwargs": kwargs}
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


# Every node type a value or a constructor argument may be, with its handler; a test's op
# nodes and template vars are dealt with before dispatch (`value`, `arg`).
NODE_HANDLERS: dict[str, Callable[[NodeResolver, dict, Where, dict | None, bool], Any]] = {
    "tensor": NodeResolver.tensor_node,
    "scalar": NodeResolver.scalar_node,
    "scalar_tensor": NodeResolver.scalar_tensor_node,
    "const": NodeResolver.const_node,
    "const_tensor": NodeResolver.const_tensor_node,
    "int_list": NodeResolver.int_list_node,
    "list": NodeResolver.list_node,
    "tuple": NodeResolver.tuple_node,
    "optional": NodeResolver.optional_node,
    "ref": NodeResolver.ref_node,
    "construct": NodeResolver.construct_node,
}
if NODE_HANDLERS.keys() != set(NODE_FIELDS) - {*OP_NODE_TYPES, "var"}:
    raise AssertionError("NODE_HANDLERS must hold exactly the node types that are neither op nodes nor vars")


_FLOATISH = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _yaml_float(text: str) -> str:
    """'1e-5' -> '1.0e-5', '2.5e3' -> '2.5e+3': how YAML 1.1 spells that float."""
    mantissa, _, exponent = text.lower().partition("e")
    return f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent if exponent[0] in '+-' else '+' + exponent}"


def path_checker(problems: Problems, suite_dir: Path, cache: dict,
                 roots: "SearchRoots", locate: bool = True) -> Callable[[Any, Where, bool], Any]:
    """A `check_path` for NodeResolver: finds `file:` modules (see files.py) and what each
    path names without importing user code (see locate.py); returns the canonical path.
    With `locate=False` a dotted path is taken as written (torch's are not imported)."""
    from .files import display_path, find_file, split_file_path
    from .locate import NotFound, locate_dotted, locate_in_file, problem
    from .reads import noting, replay

    def check(path: Any, where: Where, module: bool) -> Any:
        if not isinstance(path, str) or not path:
            return problems.add(where, f"path must be a dotted import path or file:rel/file.py::Name, "
                                       f"got {path!r}")
        key = (path, str(suite_dir), module)
        if key not in cache:
            with noting() as seen:   # what the answer rests on, for the suite cache
                try:
                    if path.startswith("file:"):
                        rel, name = split_file_path(path)
                        found = find_file(rel, suite_dir, roots)
                        canon = f"file:{Path(os.path.relpath(found, os.path.abspath(suite_dir))).as_posix()}::{name}"
                        answer = (problem(locate_in_file(found, name, display_path(found)), path, module), canon)
                    elif not locate:
                        answer = (None, path)
                    else:
                        answer = (problem(locate_dotted(path), path, module), path)
                except (OpdiffError, NotFound) as exc:
                    answer = (str(exc), path)
            cache[key] = (*answer, tuple(seen))
        error, canon, seen = cache[key]
        replay(seen)
        if error is not None:
            return problems.add(where, error)
        return canon
    return check
