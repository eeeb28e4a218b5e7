"""Dynamic shapes: one export, checked on several sizes of the dims it leaves dynamic.

`dynamic: {B: [2, 9]}` on a test whose input shapes use the dim symbol `B` keeps the test
as it is (B at the suite's value, exported with static shapes) and adds one golden per
size, `<id>@B=2` and `<id>@B=9`, each recorded like any test (the test's own weights: its
seed comes from the test's id). A check exports the sized tests of one test once, with
the axes sized by B dynamic between the smallest and the largest size, and runs each on
that one artifact. Several dims vary together: `{B: [2, 9], S: [3, 5]}` gives `@B=2_S=3`
and `@B=9_S=5`. Sized tests carry the tag `dynamic`.

A dynamic dim may size sampled input tensors only: a module argument, a list length or a
given tensor value that used it would make each size a different program. Sizes are at
least 2, as torch.export specialises a dimension of size 0 or 1.

A dim whose model needs its sizes to be multiples of a step (a window, a patch) says so:
`{H: {sizes: [32, 48], multiple_of: 16}}` exports H as 16 times a dim from 2 to 3, the
range torch.export accepts where a plain 32..48 fails on the model's own `H % 16` guard.
The step is recorded in the sized definitions only where one is given.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from .problems import BAD, Problems, Where

SIZE_MIN = 2
MAX_SIZES = 100          # sizes per dim: each is a golden, and each sized definition holds the lists
KEY = "dynamic"          # the test field, and the key of a sized test's definition
TAG = "dynamic"          # the tag every sized test carries (`--tags dynamic` selects them)


STEP_KEYS = ("sizes", "multiple_of")


class Spec(dict):
    """A parsed `dynamic` field: dim symbol -> its sizes, in order; `steps`: the dims whose
    sizes must be multiples of a step, with it."""

    def __init__(self, sizes: Mapping[str, list[int]], steps: Mapping[str, int] | None = None):
        super().__init__(sizes)
        self.steps = dict(steps or {})


def parse(raw: Any, where: Where, problems: Problems, dims: Mapping[str, int]) -> Any:
    """`{symbol: [sizes]}` (or `{symbol: {sizes: [...], multiple_of: N}}`) validated (dims of
    the suite, at most MAX_SIZES sizes of at least 2, each a multiple of the step where one
    is given, lists of one length, no two dims with the same sizes): a Spec; BAD after
    recording what is wrong."""
    if not isinstance(raw, dict) or not raw:
        return problems.add(where, "dynamic must map dim symbols to the sizes to check them at, "
                                   f"e.g. {{B: [2, 9]}}; got {raw!r}")
    out: dict[str, list[int]] = {}
    steps: dict[str, int] = {}
    for sym, sizes in raw.items():
        w = where.at(raw, sym)
        if sym not in dims:
            problems.add(w, f"'{sym}' is not a dim of this suite (defined dims: {', '.join(dims) or '(none)'}); "
                            "dynamic names the dim symbols the input shapes use")
            continue
        if isinstance(sizes, dict):
            sizes, step = _stepped(sym, sizes, w, problems)
            if step is None:
                continue
            steps[str(sym)] = step
        if (not isinstance(sizes, list) or len(sizes) < 1
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes)):
            problems.add(w, f"dynamic {sym}: give a list of sizes to check at, e.g. [2, 9]; got {sizes!r}"[:300])
            continue
        if len(sizes) > MAX_SIZES:
            problems.add(w, f"dynamic {sym}: {len(sizes):,} sizes, more than the {MAX_SIZES} sizes a dynamic dim "
                            "may be checked at (each is a golden of its own); give fewer sizes")
            continue
        small = [s for s in sizes if s < SIZE_MIN]
        if small:
            problems.add(w, f"dynamic {sym}: size {small[0]} is below {SIZE_MIN}; torch.export specialises "
                            "dimensions of size 0 and 1, so a dynamic dim is checked at 2 or more")
            continue
        if len(set(sizes)) != len(sizes):
            problems.add(w, f"dynamic {sym}: the sizes {sizes} repeat a size")
            continue
        step = steps.get(str(sym), 1)
        off = [s for s in sizes if s % step]
        if off or (step > 1 and min(sizes) // step < SIZE_MIN):
            problems.add(w, f"dynamic {sym}: size {off[0] if off else min(sizes)} is not a multiple of "
                            f"{step} that is at least {SIZE_MIN * step}; with multiple_of: {step} every size is "
                            f"{step} times a whole number of at least {SIZE_MIN}")
            continue
        out[str(sym)] = list(sizes)
    if len(out) != len(raw):
        return BAD
    lengths = {len(v) for v in out.values()}
    if len(lengths) > 1:
        return problems.add(where, "dynamic: each dim's list gives its size in each checked shape, so the "
                                   f"lists must have one length; got {', '.join(f'{k}: {v}' for k, v in out.items())}")
    seen: dict[tuple[int, ...], str] = {}
    for sym, sizes in out.items():
        other = seen.setdefault(tuple(sizes), sym)
        if other != sym:
            return problems.add(where, f"dynamic: dims {other} and {sym} have the same sizes {sizes}, so an "
                                       "axis could not be told apart by its sizes; give them different sizes")
    return Spec(out, steps)


def _stepped(sym: Any, raw: dict, where: Where, problems: Problems) -> tuple[Any, int | None]:
    """(sizes, step) of `{sizes: [...], multiple_of: N}`; step None after recording what is wrong."""
    unknown = [k for k in raw if k not in STEP_KEYS]
    step = raw.get("multiple_of")
    if unknown or "sizes" not in raw or not isinstance(step, int) or isinstance(step, bool) or not 2 <= step <= 4096:
        problems.add(where, f"dynamic {sym}: write {{sizes: [32, 48], multiple_of: 16}} (multiple_of a whole "
                            f"number from 2 to 4096), or a plain list of sizes; got {raw!r}"[:300])
        return None, None
    return raw["sizes"], step


def sizes_at(spec: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """The dims' sizes of each sized test, in order."""
    n = len(next(iter(spec.values())))
    return [{sym: spec[sym][k] for sym in spec} for k in range(n)]


def sized_id(test_id: str, at: Mapping[str, int]) -> str:
    return test_id + "@" + "_".join(f"{sym}={n}" for sym, n in at.items())


SIZED_SUFFIX = re.compile(r"@[A-Za-z]\w*=\d+(?:_[A-Za-z]\w*=\d+)*$")
"""What sized_id appends, told from the id alone."""


def unsized_id(test_id: str) -> str:
    """The id of the test a sized test sizes, from its id alone (`nn_gru@T=9` -> `nn_gru`);
    any other id unchanged."""
    return SIZED_SUFFIX.sub("", test_id)


def seed_id(test_id: str, definition: Mapping[str, Any]) -> str:
    """The id a sized test draws its seed from: that of the test it sizes."""
    at = (definition.get(KEY) or {}).get("at")
    suffix = sized_id("", at) if at else ""
    return test_id[:-len(suffix)] if suffix and test_id.endswith(suffix) else test_id


def sized_definitions(static: Mapping[str, Any], sized: Sequence[Mapping[str, Any]],
                      spec: Spec) -> tuple[list[dict[str, Any]], str]:
    """The definitions of the sized tests, in the order of `sized`: each with every tensor
    input axis sized by a dynamic dim marked (`"dynamic": {axis: symbol}` on its node) and
    the dims recorded (`"dynamic": {"dims": spec, "at": sizes}`). ([], where) when the sized
    definitions differ from the static one anywhere but in tensor shapes, or in an axis that
    no dim's sizes explain."""
    marks: dict[tuple[Any, ...], dict[str, str]] = {}
    by_sizes = {tuple(v): sym for sym, v in spec.items()}
    problem = _marks(static, [dict(d) for d in sized], (), marks, by_sizes)
    if problem:
        return [], problem
    out = []
    steps = spec.steps
    for definition, at in zip(sized, sizes_at(spec)):
        d = _marked(definition, (), marks)
        d[KEY] = {"dims": {s: list(v) for s, v in spec.items()}, "at": at, **({"steps": dict(steps)} if steps else {})}
        d["tags"] = [*d.get("tags", []), *([] if TAG in d.get("tags", []) else [TAG])]
        out.append(d)
    return out, ""


def _marks(static: Any, sized: list[Any], path: tuple[Any, ...], marks: dict, by_sizes: dict) -> str:
    """Walk the static definition and the sized ones together, recording in `marks` which
    axes of which tensor nodes each dim sizes; the path of the first other difference."""
    if isinstance(static, dict):
        if any(not isinstance(s, dict) or s.keys() != static.keys() for s in sized):
            return _where(path)
        if static.get("type") == "tensor" and isinstance(static.get("shape"), list):
            axes: dict[str, str] = {}
            for axis, n in enumerate(static["shape"]):
                got = tuple(s["shape"][axis] if len(s["shape"]) == len(static["shape"]) else None for s in sized)
                if None in got:
                    return _where(path + ("shape",))
                if len(set(got)) == 1 and got[0] == n:
                    continue
                sym = by_sizes.get(got)
                if sym is None:
                    return _where(path + ("shape", axis))
                axes[str(axis)] = sym
            if axes:
                marks[path] = axes
        for key, value in static.items():
            if key == "shape" and static.get("type") == "tensor":
                continue
            problem = _marks(value, [s[key] for s in sized], path + (key,), marks, by_sizes)
            if problem:
                return problem
        return ""
    if isinstance(static, list):
        if any(not isinstance(s, list) or len(s) != len(static) for s in sized):
            return _where(path)
        for i, value in enumerate(static):
            problem = _marks(value, [s[i] for s in sized], path + (i,), marks, by_sizes)
            if problem:
                return problem
        return ""
    return "" if all(s == static for s in sized) else _where(path)


def dims_used(definition: Any) -> set[str]:
    """The dims that size some axis of a sized definition's tensor inputs."""
    used: set[str] = set()
    stack = [definition]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            axes = node.get(KEY) if node.get("type") == "tensor" else None
            used.update(axes.values() if isinstance(axes, dict) else ())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return used


def _marked(node: Any, path: tuple[Any, ...], marks: dict) -> Any:
    if isinstance(node, dict):
        out = {k: _marked(v, path + (k,), marks) for k, v in node.items()}
        if path in marks:
            out[KEY] = marks[path]
        return out
    if isinstance(node, list):
        return [_marked(v, path + (i,), marks) for i, v in enumerate(node)]
    return node


def _where(path: tuple[Any, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(the test)"


def group_definition(definition: Mapping[str, Any]) -> dict[str, Any]:
    """What the sized tests of one test share: the definition with every dynamic axis
    written as its dim and the sizes dropped. Their one artifact is keyed by it."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: strip(v) for k, v in node.items()}
            axes = node.get(KEY) if node.get("type") == "tensor" else None
            if isinstance(axes, dict) and isinstance(node.get("shape"), list):
                out["shape"] = [axes.get(str(i), n) for i, n in enumerate(node["shape"])]
            return out
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    out = strip(dict(definition))
    steps = definition[KEY].get("steps")
    out[KEY] = {"dims": dict(definition[KEY]["dims"]), **({"steps": dict(steps)} if steps else {})}
    return out


def ranges(definition: Mapping[str, Any]) -> dict[str, tuple[int, int, int, int]]:
    """Each dynamic dim's (smallest, largest, first size, step): the range its export allows,
    the size it traces at (the same whichever sized test exports) and the step its sizes
    are multiples of (1: any size)."""
    steps = definition[KEY].get("steps") or {}
    return {sym: (min(sizes), max(sizes), sizes[0], int(steps.get(sym, 1)))
            for sym, sizes in definition[KEY]["dims"].items()}


def at_example(node: Any, definition: Mapping[str, Any]) -> Any:
    """An input node of a sized test with every axis a dim sizes set to that dim's example
    size: what each sized test of one test draws alike (an int8 preset's calibration)."""
    if isinstance(node, list):
        return [at_example(n, definition) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: at_example(v, definition) for k, v in node.items()}
    marked = node.get(KEY) if node.get("type") == "tensor" else None
    if isinstance(marked, dict) and isinstance(node.get("shape"), list):
        examples = {sym: example for sym, (_, _, example, _) in ranges(definition).items()}
        out["shape"] = [examples.get(str(marked.get(str(axis))), n) for axis, n in enumerate(node["shape"])]
    return out


def leaf_axes(nodes: Sequence[Any], values: Sequence[Any]) -> list[dict[int, str]]:
    """For each tensor the sampled `values` hold, in the order a flat module takes them
    (depth first), the axes its node marks dynamic ({} for none)."""
    out: list[dict[int, str]] = []
    for node, value in zip(nodes, values):
        _leaf_axes(node, value, out)
    return out


def _leaf_axes(node: Any, value: Any, out: list[dict[int, str]]) -> None:
    if hasattr(value, "shape") and hasattr(value, "dtype"):     # a tensor: one input of the flat module
        marked = node.get(KEY) if isinstance(node, dict) and node.get("type") == "tensor" else None
        out.append({int(a): s for a, s in (marked or {}).items()})
        return
    if not isinstance(value, (list, tuple)) or not isinstance(node, dict):
        return
    t = node.get("type")
    if t == "optional":
        _leaf_axes(node["elem"], value, out)
    elif t == "list":
        for v in value:
            _leaf_axes(node["elem"], v, out)
    elif t == "tuple":
        for n, v in zip(node["elems"], value):
            _leaf_axes(n, v, out)
    else:   # a literal list: no tensor in it was sampled from a node that marks axes
        for v in value:
            _leaf_axes(None, v, out)
