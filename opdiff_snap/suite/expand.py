"""A merged suite document -> TestCases: templates, cases, pairs, ids, every node
resolved and validated (document.py reads the files and their includes).

Every case is built through `case_from_definition`, the same path `check` takes on a
stored definition.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.errors import OpdiffError
from ..core.safetext import printable, unsafe_char
from . import dynamic
from .document import EXT_DEFAULTS, Document, RawTest, plain_number
from .extensions import parse_extension
from .fields import DEVICES, EXTENSION_KEYS, NODE_FIELDS, SIDE_FIELDS, TEST_KEYS, dtype_family
from .files import SearchRoots
from .model import Call, TestCase, Tolerance
from .problems import BAD, Problems, Where, check_keys, plain
from .profiles import NORMAL, floating_dtypes, id_with_profile, in_precisions
from .resolve import NodeResolver, path_checker
from .spechash import file_modules, spec_hash
from .torch_fns import EXAMPLES, TORCH_CALL, definition_fns, fn_refusal

_BAD_ID = re.compile(r"[\s/\\;*]")


def sanitize(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(value))


def _rebase(node: Any, from_dir: Path, to_dir: Path) -> Any:
    """Rewrite `file:` paths of a preset defined in another directory to be relative to `to_dir`."""
    if from_dir == to_dir:
        return node
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "path" and isinstance(v, str) and v.startswith("file:"):
                rel, sep, name = v[5:].partition("::")
                v = "file:" + Path(os.path.relpath(from_dir / rel, to_dir)).as_posix() + sep + name
            out[k] = _rebase(v, from_dir, to_dir)
        return out
    if isinstance(node, list):
        return [_rebase(v, from_dir, to_dir) for v in node]
    return node


class Expander:
    """Resolves one merged document into TestCases, recording every problem."""

    def __init__(self, doc: Document, problems: Problems, import_cache: dict, roots: SearchRoots,
                 check_names: bool = True):
        self.doc, self.problems, self.import_cache, self.roots = doc, problems, import_cache, roots
        self.check_names = check_names
        self._resolvers: dict[Path, NodeResolver] = {}
        self._presets: dict[str, Any] = {}
        self._resolving: list[str] = []

    def resolver(self, suite_dir: Path) -> NodeResolver:
        r = self._resolvers.get(suite_dir)
        if r is None:
            check = path_checker(self.problems, suite_dir, self.import_cache, self.roots, self.check_names)
            r = NodeResolver(self.problems, self.doc.dims, self.doc.presets,
                             functools.partial(self._preset_in, suite_dir), check)
            self._resolvers[suite_dir] = r
        return r

    def _preset_in(self, suite_dir: Path, name: str, where: Where) -> Any:
        return self.preset(name, where, suite_dir)

    def preset(self, name: str, where: Where, used_in: Path | None = None) -> Any:
        raw, w, pdir = self.doc.presets[name]
        if name not in self._presets:
            if name in self._resolving:
                chain = " -> ".join(self._resolving[self._resolving.index(name):] + [name])
                return self.problems.add(where, f"preset cycle: {chain}")
            self._resolving.append(name)
            try:
                self._presets[name] = self.resolver(pdir).value(raw, w, None)
            finally:
                self._resolving.pop()
        value = self._presets[name]
        return value if value is BAD or used_in is None else _rebase(value, pdir, used_in)

    def cases(self) -> list[tuple[TestCase, RawTest]]:
        """Every case with the raw test it came from, in order."""
        for name in self.doc.presets:
            self.preset(name, self.doc.presets[name][1])
        out: list[tuple[TestCase, RawTest]] = []
        for rt in self.doc.tests:
            out.extend((case, rt) for case in self.test(rt))
        return out

    # ---- one test entry ------------------------------------------------------------------
    def test(self, rt: RawTest) -> list[TestCase]:
        """The test's cases: itself (per template assignment and profile), and where it has
        `dynamic`, its sized tests."""
        cases = self._static(rt)
        if cases and isinstance(rt.raw, dict) and dynamic.KEY in rt.raw:
            cases += self._sized(rt, cases)
        return cases

    def _sized(self, rt: RawTest, statics: list[TestCase]) -> list[TestCase]:
        """The sized tests of a test with `dynamic`: it expanded again with each size of its
        dynamic dims, each compared with the test at the suite's sizes (suite/dynamic.py)."""
        w = Where(rt.where.file, rt.where.field, rt.where.mark, statics[0].id)
        at = w.at(rt.raw, dynamic.KEY)
        spec = dynamic.parse(rt.raw[dynamic.KEY], at, self.problems, self.doc.dims)
        if spec is BAD:
            return []
        normal = [c for c in statics if c.profile == NORMAL]
        sized: list[list[TestCase]] = []
        for sizes in dynamic.sizes_at(spec):
            again = Expander(replace(self.doc, dims={**self.doc.dims, **sizes}), Problems(), self.import_cache,
                             self.roots, check_names=False)
            cases = [c for c in again._static(rt) if c.profile == NORMAL]
            if [c.id for c in cases] != [c.id for c in normal]:
                self.problems.add(at, "dynamic: the test expands to other tests at these sizes; a dynamic dim "
                                      "may size input tensors only")
                return []
            sized.append(cases)
        out: list[TestCase] = []
        for i, static in enumerate(normal):
            definitions, where = dynamic.sized_definitions(static.definition, [s[i].definition for s in sized], spec)
            if not definitions:
                self.problems.add(at, f"dynamic {', '.join(spec)}: test '{static.id}' uses "
                                      f"{'it' if len(spec) == 1 else 'them'} at {where}, not only in the "
                                      "shape of a sampled input tensor; a dynamic dim may size input tensors "
                                      "only (a module argument, list length or given value sized by it "
                                      "would make each size another program): give that use a dim of its own")
                return []
            unused = [sym for sym in spec if sym not in dynamic.dims_used(definitions[0])]
            if unused:
                self.problems.add(at, f"dynamic {', '.join(unused)}: no input shape of test '{static.id}' uses "
                                      f"{'it' if len(unused) == 1 else 'them'}, so every size would be the same "
                                      "test; name only the dims its input tensors' shapes use")
                return []
            out.extend(case_from_definition(dynamic.sized_id(static.id, sizes), d, rt.suite, self.roots.import_dirs)
                       for d, sizes in zip(definitions, dynamic.sizes_at(spec)))
        return out

    def _static(self, rt: RawTest) -> list[TestCase]:
        raw, w, P = rt.raw, rt.where, self.problems
        if not isinstance(raw, dict):
            P.add(w, f"a test must be a mapping with keys {', '.join(TEST_KEYS[:3])}, ..., got {raw!r}")
            return []
        check_keys(raw, TEST_KEYS, w, P, "a test")
        tid = raw.get("id")
        control = unsafe_char(tid) if isinstance(tid, str) else None
        if control:
            P.add(w.at(raw, "id"), f"id '{printable(tid)}' holds {control}, a control, bidi or line-separator "
                                   "character; a test id is printed, and written into JUnit XML and HTML, so it "
                                   "must be plain text: remove the character (an escape such as \\e or \\0 in "
                                   "a quoted YAML string)")
            tid = None
        elif tid is not None and (not isinstance(tid, str) or not tid or _BAD_ID.search(tid)):
            P.add(w.at(raw, "id"), f"id {tid!r} must be a non-empty string without spaces, '/', '\\', ';' or '*'")
            tid = None
        op = raw.get("op")
        if op is None:
            P.add(w, "missing required field 'op' (an ATen op name or a module node)")
        base = tid or self._default_id(op, rt.index)
        w = Where(w.file, w.field, w.mark, base)
        r = self.resolver(rt.suite.parent)
        common = self._common_fields(raw, w, rt.defaults)
        if op is None:
            return []
        wo = w.at(raw, "op")
        if isinstance(op, str):
            call = self._op_call(op, wo)
            return self._finish(rt, base, [("", None)], lambda env: (call, None), common)
        if not isinstance(op, dict):
            P.add(wo, f"op must be an op name like aten::add.Tensor or a module node, got {op!r}")
            return []
        t = op.get("type")
        if t not in ("module", "template_module", "template_compare_pair"):
            P.add(wo.at(op, "type") if "type" in op else wo,
                  f"op node type must be module, template_module or template_compare_pair, got {t!r}")
            return []
        check_keys(op, ("type",) + NODE_FIELDS[t], wo, P, f"a '{t}' op")
        if t == "module":
            call = self._module_call(op, wo, None, r, None)
            return self._finish(rt, base, [("", None)], lambda env: (call, None), common)
        envs = self._assignments(op, wo)
        if t == "template_module":
            return self._finish(rt, base, envs, lambda env: (
                self._module_call(op, wo, env, r, None), None), common)
        return self._pair(rt, base, op, wo, envs, r, common)

    def _default_id(self, op: Any, index: int) -> str:
        if isinstance(op, dict) and op.get("type") in ("template_module", "template_compare_pair"):
            return "template" if op["type"] == "template_module" else "template_compare_pair"
        name = "test"
        if isinstance(op, str):
            name = op.rpartition("::")[2] or op
        elif isinstance(op, dict) and isinstance(op.get("path"), str):
            name = re.split(r"::|\.", op["path"])[-1]
        return f"{sanitize(name)}_{index}"

    def _common_fields(self, raw: dict, w: Where, defaults: dict) -> dict:
        P = self.problems
        out: dict[str, Any] = {"raw_in": raw.get("in"), "raw_kwargs": raw.get("kwargs", {}) or {},
                               "raw_out": raw.get("out")}
        if "in" not in raw:
            P.add(w, "missing required field 'in' (the list of positional inputs; may be empty)")
        elif not isinstance(raw["in"], list):
            P.add(w.at(raw, "in"), f"'in' must be a list of nodes, got {raw['in']!r}")
            out["raw_in"] = BAD
        if not isinstance(out["raw_kwargs"], dict):
            P.add(w.at(raw, "kwargs"), f"kwargs must map names to nodes, got {out['raw_kwargs']!r}")
            out["raw_kwargs"] = BAD
        impl = raw.get("impl")
        if impl is not None and not isinstance(impl, str):
            P.add(w.at(raw, "impl"), f"impl must be a string label, got {impl!r}")
        out["impl"] = impl if isinstance(impl, str) else None
        device = raw.get("device", "cpu")
        if device not in DEVICES:
            P.add(w.at(raw, "device"), f"device {device!r} is not one of {', '.join(DEVICES)}")
        out["device"] = device
        cast = raw.get("cast_input0_to_complex", False)
        if not isinstance(cast, bool):
            P.add(w.at(raw, "cast_input0_to_complex"), f"cast_input0_to_complex must be true or false, got {cast!r}")
            cast = False
        out["cast"] = cast
        num = plain_number(P)
        for k in EXTENSION_KEYS:
            out[k] = defaults.get(k, EXT_DEFAULTS[k])
            if k in raw:
                v = parse_extension(k, raw[k], w.at(raw, k), P, num)
                out[k] = v if v is not BAD else out[k]
        return out

    def _op_call(self, op: str, w: Where) -> Any:
        key = ("op:" + op, "")
        if self.check_names and key not in self.import_cache:
            from .construct import resolve_op
            try:
                resolve_op(op)
                self.import_cache[key] = None
            except OpdiffError as exc:
                self.import_cache[key] = str(exc)
        if self.import_cache.get(key):
            return self.problems.add(w, self.import_cache[key])
        return {"kind": "op", "target": op, "args": [], "kwargs": {}, "impl": None}

    def _module_call(self, node: dict, w: Where, env: dict | None, r: NodeResolver, impl: str | None,
                     common: dict | None = None, wc: Where | None = None) -> Any:
        """A module call from `node` (path, args, kwargs); for pair sides, `common` args apply
        unless the side has its own, and common kwargs are updated by the side's."""
        if "path" not in node:
            return self.problems.add(w, "module node is missing required field 'path'")
        path = r.check_path(node["path"], w.at(node, "path"), True)
        wc = wc or w
        src, ws = (node, w) if node.get("args") is not None or not common else (common, wc)
        args = r.args_list(src.get("args"), ws.at(src, "args"), env)
        items: list[tuple[Any, Any, Where]] = []
        sides: list[tuple[dict, Where]] = ([(common, wc)] if common else []) + [(node, w)]
        for c, cw in sides:
            kw = c.get("kwargs") or {}
            if not isinstance(kw, dict):
                self.problems.add(cw.at(c, "kwargs"), f"kwargs must be a mapping, got {kw!r}")
                return BAD
            items = [i for i in items if i[0] not in kw] + [(k, v, cw.at(c, "kwargs").at(kw, k))
                                                             for k, v in kw.items()]
        kwargs = r.kwargs_map(items, env)
        config = r.config(node["config"], w.at(node, "config"), env) if "config" in node else None
        if BAD in (path, args, kwargs, config):
            return BAD
        call = {"kind": "module", "target": path, "args": args, "kwargs": kwargs, "impl": impl}
        if path == TORCH_CALL:   # what it calls is judged here, and again in the worker
            for fn in definition_fns(call):
                why = fn_refusal(fn)
                if why is not None:
                    return self.problems.add(w.at(node, "kwargs"), f"TorchCall: {why}. A TorchCall calls only "
                                             f"torch's operator functions and Tensor methods ({EXAMPLES}).")
        return call if config is None else {**call, "config": config}   # absent: spec hashes as before

    def _assignments(self, op: dict, w: Where) -> list[tuple[str, dict | None]]:
        """(id suffix, env) per expansion, in the format page's order."""
        P = self.problems
        vars_ = op.get("vars", {}) or {}
        if not isinstance(vars_, dict) or not all(
                isinstance(v, list) and v and isinstance(k, str) for k, v in vars_.items()):
            P.add(w.at(op, "vars"), "vars must map each variable name to a non-empty list of values")
            return []
        for k, vals in vars_.items():
            for i, v in enumerate(vals):
                plain(v, w.at(op, "vars").at(vars_, k).at(vals, i), P)
        names = sorted(vars_)
        cases = op.get("cases")
        if cases is None:
            cases = [{}]
        elif not isinstance(cases, list) or not cases:
            P.add(w.at(op, "cases"), "cases must be a non-empty list of {var: value} mappings")
            return []
        envs: list[tuple[str, dict | None]] = []
        for ci, case in enumerate(cases):
            wc = w.at(op, "cases").at(cases, ci) if op.get("cases") is not None else w
            if not isinstance(case, dict) or (op.get("cases") is not None and not case):
                P.add(wc, f"each case must be a non-empty mapping of declared vars to values, got {case!r}")
                continue
            unknown = [k for k in case if k not in vars_]
            if unknown:
                check_keys(case, names, wc, P, "a case (only declared vars)")
                continue
            rest = [n for n in names if n not in case]
            for combo in itertools.product(*(vars_[n] for n in rest)):
                env = {**case, **dict(zip(rest, combo))}
                envs.append(("".join(f"__{n}={sanitize(env[n])}" for n in names), env))
        return envs

    def _pair(self, rt, base, op, wo, envs, r, common) -> list[TestCase]:
        P = self.problems
        com = op.get("common", {}) or {}
        wc = wo.at(op, "common")
        if not isinstance(com, dict):
            P.add(wc, "common must be a mapping with args and/or kwargs")
            com = {}
        check_keys(com, ("args", "kwargs"), wc, P, "common")
        sides = {}
        for s in ("a", "b"):
            side, ws = op.get(s), wo.at(op, s)
            if not isinstance(side, dict):
                P.add(ws if s in op else wo,
                      f"side '{s}' must be a mapping with impl, type: module, path, args, kwargs")
                return []
            check_keys(side, SIDE_FIELDS, ws, P, f"side '{s}'")
            if side.get("type", "module") != "module":
                P.add(ws.at(side, "type"), f"side '{s}' must have type: module, got {side.get('type')!r}")
            if not isinstance(side.get("impl"), str):
                P.add(ws, f"side '{s}' needs an 'impl' label (a string)")
            sides[s] = (side, ws)

        def build(env):
            return tuple(self._module_call(side, ws, env, r, side.get("impl"), com, wc)
                         for side, ws in (sides["a"], sides["b"]))
        return self._finish(rt, base, envs, build, common, pair=True)

    def _finish(self, rt: RawTest, base: str, envs, build, common: dict, pair: bool = False) -> list[TestCase]:
        out = []
        for suffix, env in envs:
            tid = base + suffix
            call, pair_call = build(env)
            w = Where(rt.where.file, rt.where.field, rt.where.mark, tid)
            r = self.resolver(rt.suite.parent)
            raw = rt.raw
            inputs = kwargs = BAD
            if common["raw_in"] not in (None, BAD):
                lst = common["raw_in"]
                inputs = [r.value(n, w.at(raw, "in").at(lst, i), env) for i, n in enumerate(lst)]
                inputs = BAD if BAD in inputs else inputs
            elif common["raw_in"] is None:
                inputs = BAD
            if common["raw_kwargs"] is not BAD:
                kw = common["raw_kwargs"]
                kwargs = {str(k): r.value(v, w.at(raw, "kwargs").at(kw, k), env) for k, v in kw.items()}
                kwargs = BAD if BAD in kwargs.values() else kwargs
            out_node = None
            if common["raw_out"] is not None:
                out_node = r.value(common["raw_out"], w.at(raw, "out"), env)
            cast_at = w.at(raw, "cast_input0_to_complex")
            if common["cast"] and inputs is not BAD and not self._complex_ok(inputs, cast_at):
                continue
            if BAD in (call, pair_call, inputs, kwargs, out_node):
                continue
            definition = {
                "call": call, "pair": pair_call, "inputs": inputs, "kwargs": kwargs, "out": out_node,
                "device": common["device"], "impl": common["impl"],
                "cast_input0_to_complex": common["cast"],
                **{k: common[k] for k in EXTENSION_KEYS if k != "profiles"},
            }
            profiles = common["profiles"]
            dtypes = floating_dtypes([inputs, kwargs])
            if profiles != [NORMAL] and not dtypes:
                # the suite's defaults reach every test: one without floating inputs keeps normal
                if "profiles" in raw:
                    self.problems.add(w.at(raw, "profiles"),
                                      f"profiles {profiles}: test '{tid}' has no floating tensor input, so "
                                      "an input profile would change nothing; drop 'profiles' from it, or give "
                                      "it a floating tensor input")
                    continue
                profiles = [NORMAL]
            for profile in (p for listed in profiles for p in in_precisions(listed, dtypes)):
                # a profile is part of what the outputs depend on; normal adds nothing, so the
                # goldens of tests without profiles keep their spec hashes
                variant = definition if profile == NORMAL else {**definition, "profile": profile}
                out.append(case_from_definition(id_with_profile(tid, profile), variant, rt.suite,
                                                self.roots.import_dirs))
        return out

    def _complex_ok(self, inputs: list, w: Where) -> bool:
        n = inputs[0] if inputs else None
        if n is not None and n["type"] in ("tensor", "const_tensor") and (
                dtype_family(n["dtype"]) == "complex" or dtype_family(n["dtype"]) == "float" and n["shape"][-1] == 2):
            return True
        self.problems.add(w, "cast_input0_to_complex needs input 0 to be a complex tensor or a float "
                             "tensor whose last dimension is 2 (real, imag)")
        return False


def case_from_definition(test_id: str, definition: dict, suite_path: Path,
                         import_dirs: tuple[Path, ...] | None = None) -> TestCase:
    """Rebuild a TestCase from its canonical definition (as stored in goldens).
    `import_dirs` default to those of a run of `suite_path` from the current directory."""
    d = json.loads(json.dumps(definition))
    try:
        suite_path = Path(suite_path)
        if import_dirs is None:
            import_dirs = SearchRoots.for_suite(suite_path).import_dirs
        sources = file_modules(d, suite_path.parent)
        return assemble_case(test_id, d, suite_path, sources, spec_hash(d, sources), tuple(import_dirs))
    except (KeyError, TypeError, AttributeError) as exc:
        raise OpdiffError(f"test '{test_id}': its stored definition is malformed ({type(exc).__name__}: {exc}); "
                          "re-record it with --force.") from None


def assemble_case(test_id: str, d: dict, suite_path: Path, sources: tuple[Path, ...], spec: str,
                  import_dirs: tuple[Path, ...]) -> TestCase:
    """A TestCase of a canonical definition (JSON values, owned by the case) and what was
    found for it: its `file:` modules and spec hash. Raises KeyError, TypeError or
    AttributeError on a malformed definition."""
    call = _call(d["call"])
    pair = _call(d["pair"]) if d.get("pair") else None
    return TestCase(
        id=test_id, suite=suite_path, call=call, inputs=tuple(d["inputs"]), kwargs=d["kwargs"],
        pair=pair, device=d.get("device", "cpu"), impl=d.get("impl"), out=d.get("out"),
        cast_input0_to_complex=bool(d.get("cast_input0_to_complex", False)),
        tolerance={k: Tolerance(v.get("atol"), v.get("rtol"), v.get("baseline_factor"),
                                   v.get("precision_factor"), v.get("steps"), v.get("min_sqnr"))
                   for k, v in d.get("tolerance", {}).items()},
        seeds=tuple(d.get("seeds", [0])), tags=tuple(d.get("tags", [])), skip=dict(d.get("skip", {})),
        grad=bool(d.get("grad", False)), profile=d.get("profile", NORMAL), definition=d, spec_hash=spec,
        source_files=sources, import_dirs=import_dirs)


def _call(c: dict) -> Call:
    return Call(kind=c["kind"], target=c["target"], args=tuple(c.get("args", [])),
                kwargs=dict(c.get("kwargs", {})), impl=c.get("impl"), config=c.get("config"))
