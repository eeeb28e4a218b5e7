"""Everything a golden's metadata must satisfy before check may use it.

`problems` covers what reading relies on: the attributes and their types, each tensor
record (its NumPy dtype is the one its torch dtype is stored as, its byte count fits
its shape, its bytes lie inside the data, and the records together are exactly as long
as the data the array declares) and the nested structures (`args`, `kwargs`,
`outputs`, `grads`, `reference`, `states`), which may refer only to tensors the golden
holds. `GoldenStore.read` refuses a golden with any problem, so check reports it
CORRUPT, and `opdiff goldens verify` reports the same problems.

`definition_findings` covers what check relies on beyond that: the stored definition
rebuilds into a test case, and that case's spec hash is the stored `spec_hash`. Check
calls it on every golden it runs, verify on every golden.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.limits import MAX_SEED
from ..core.safetext import printable, unsafe_char
from ..core.trees import MAX_DEPTH
from .encode import FORMAT, MARK
from .packed import ITEMSIZE, STORED_AS

SHA256 = re.compile(r"^[0-9a-f]{64}$")
TEST_TYPES = ("op", "module", "pair")
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "test_id": str, "seed": int, "spec_hash": str, "suite": str, "test_type": str, "created": str,
    "baseline": dict, "env": dict, "definition": dict, "args": dict, "kwargs": dict, "states": dict,
    "outputs": dict, "tensors": dict,
}
OPTIONAL: dict[str, type | tuple[type, ...]] = {"grads": (dict, type(None)), "extra": (dict, type(None)),
                                                 "reference": (dict, type(None))}
_SCALARS = (type(None), bool, int, float, str)


def _type_name(t: type | tuple[type, ...]) -> str:
    names = {dict: "a JSON object", str: "a string", int: "an integer", type(None): "null", list: "a list"}
    ts = t if isinstance(t, tuple) else (t,)
    return " or ".join(names.get(x, x.__name__) for x in ts)


def _is(value: Any, t: type | tuple[type, ...]) -> bool:
    ts = t if isinstance(t, tuple) else (t,)
    if isinstance(value, bool) and bool not in ts:
        return False
    return isinstance(value, ts)


def record_problems(name: str, rec: Any, data_nbytes: int | None = None) -> list[str]:
    """What is wrong with one entry of the `tensors` table."""
    if not isinstance(rec, dict):
        return [f"tensor '{name}': its record is not a JSON object"]
    out = []
    for key in ("offset", "nbytes"):
        v = rec.get(key)
        if not isinstance(v, int) or not _is(v, int) or v < 0:
            out.append(f"tensor '{name}': {key} {v!r} is not a non-negative integer")
    shape = rec.get("shape")
    if not isinstance(shape, list) or not all(_is(n, int) and n >= 0 for n in shape):
        out.append(f"tensor '{name}': shape {shape!r} is not a list of non-negative integers")
        shape = None
    torch_dtype = rec.get("torch_dtype")
    if torch_dtype not in STORED_AS:
        out.append(f"tensor '{name}': torch_dtype {torch_dtype!r} is not a dtype a golden can hold")
        torch_dtype = None
    elif rec.get("dtype") != STORED_AS[torch_dtype]:
        out.append(f"tensor '{name}': dtype {rec.get('dtype')!r} is not the NumPy dtype {torch_dtype} "
                   f"is stored as ('{STORED_AS[torch_dtype]}')")
    sha = rec.get("sha256")
    if not isinstance(sha, str) or not SHA256.match(sha):
        out.append(f"tensor '{name}': sha256 {sha!r} is not 64 lowercase hex digits")
    if out or shape is None or torch_dtype is None:
        return out
    numel = 1
    for n in shape:
        numel *= n
    need = numel * ITEMSIZE[torch_dtype]
    if need != rec["nbytes"]:
        out.append(f"tensor '{name}': shape {shape} of {torch_dtype} takes {need} bytes, but nbytes "
                   f"says {rec['nbytes']}")
    elif data_nbytes is not None and rec["offset"] + rec["nbytes"] > data_nbytes:
        out.append(f"tensor '{name}': bytes {rec['offset']}..{rec['offset'] + rec['nbytes']} lie outside "
                   f"the {data_nbytes} bytes of packed data")
    return out


def structure_problems(structure: Any, section: str) -> tuple[list[str], list[int]]:
    """(problems, tensor indices in walk order) of one nested structure (core/trees.py JSON)."""
    out: list[str] = []
    indices: list[int] = []
    stack: list[tuple[Any, str, int]] = [(structure, section, 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            out.append(f"{where}: nested deeper than {MAX_DEPTH} levels")
            continue
        if not isinstance(node, dict) or len(node) != 1:
            out.append(f"{where}: {node!r:.60} is not a structure node (one of tensor, tuple, list, "
                       "dict, value, float, dtype)")
            continue
        ((kind, v),) = node.items()
        if kind == "tensor":
            if not _is(v, int) or v < 0:
                out.append(f"{where}: tensor index {v!r} is not a non-negative integer")
            else:
                indices.append(v)
        elif kind in ("tuple", "list"):
            if not isinstance(v, list):
                out.append(f"{where}: a {kind} node must hold a list")
                continue
            stack.extend((c, f"{where}[{i}]", depth + 1) for i, c in reversed(list(enumerate(v))))
        elif kind == "dict":
            if not isinstance(v, list) or not all(isinstance(p, list) and len(p) == 2 and _key(p[0]) for p in v):
                out.append(f"{where}: a dict node must hold [key, value] pairs whose keys are strings, "
                           "numbers, bools or null")
                continue
            twice = _repeated([k for k, _ in v])
            if twice:   # reading it back would keep only one of them
                out.append(f"{where}: the key {twice[0]!r} appears more than once")
                continue
            stack.extend((c, f"{where}[{k!r}]", depth + 1) for k, c in reversed(v))
        elif kind == "value":
            if not isinstance(v, _SCALARS):
                out.append(f"{where}: a value node must hold a number, string, bool or null")
        elif kind == "float":
            if v not in ("nan", "inf", "-inf"):
                out.append(f"{where}: a float node must hold 'nan', 'inf' or '-inf', not {v!r}")
        elif kind == "dtype":
            if not isinstance(v, str) or not _is_torch_dtype(v):
                out.append(f"{where}: {v!r} is not a torch dtype")
        else:
            out.append(f"{where}: unknown structure node {kind!r}")
    return out, indices


def _key(k: Any) -> bool:
    """Whether `k` is a dict key a structure may hold (trees.dict_key)."""
    return isinstance(k, _SCALARS) and not (isinstance(k, float) and not math.isfinite(k))


def _repeated(keys: list[Any]) -> list[Any]:
    """The keys that occur more than once (1 and "1" are two keys; 1 and 1.0 one)."""
    seen: set[Any] = set()
    out = []
    for k in keys:
        if k in seen:
            out.append(k)
        seen.add(k)
    return out


def _root(structure: Any) -> tuple[str | None, Any]:
    if isinstance(structure, dict) and len(structure) == 1:
        return next(iter(structure.items()))
    return None, None


def _dict_keys(structure: Any) -> list[Any] | None:
    """The keys of a (sound) structure whose top is a dict node, in order, else None."""
    kind, pairs = _root(structure)
    return [k for k, _ in pairs] if kind == "dict" else None


def problems(attrs: Any, data_nbytes: int | None = None) -> list[str]:
    """Every reason the attributes of a golden cannot be read back as the golden they
    claim to be (empty when they can). `data_nbytes`: the length of the packed data."""
    if not isinstance(attrs, dict):
        return ["its attributes are not a JSON object"]
    if attrs.get(MARK) != FORMAT:
        return [f"attribute {MARK!r} is {attrs.get(MARK)!r}, expected {FORMAT}"]
    out = _type_problems(attrs)
    if out:
        return out
    tensors: dict = attrs["tensors"]
    out = _field_problems(attrs) + _tensor_problems(tensors, data_nbytes)
    sections, found = _sections(attrs)
    out += found
    used: set[str] = set()
    out += _section_problems(attrs, sections, tensors, used)
    out += _state_problems(attrs["states"], tensors, used)
    stray = sorted(set(tensors) - used)
    if stray:
        out.append(f"tensors {', '.join(repr(s) for s in stray[:5])} are not referred to by any structure")
    return out


def _type_problems(attrs: dict) -> list[str]:
    """Each required attribute missing, and each attribute of the wrong type."""
    out = []
    for key, t in {**REQUIRED, **OPTIONAL}.items():
        if key not in attrs:
            if key in REQUIRED:
                out.append(f"attribute '{key}' is missing")
        elif not _is(attrs[key], t):
            out.append(f"attribute '{key}' is {type(attrs[key]).__name__}, not {_type_name(t)}")
    return out


def _field_problems(attrs: dict) -> list[str]:
    """The test type, seed, test id and baseline, each checked for what it may hold."""
    out = []
    if attrs["test_type"] not in TEST_TYPES:
        out.append(f"test_type {attrs['test_type']!r} is not one of {', '.join(TEST_TYPES)}")
    if not 0 <= attrs["seed"] <= MAX_SEED:
        out.append(f"seed {attrs['seed']} is not from 0 to 2**63-1")
    control = unsafe_char(attrs["test_id"])
    if control:
        out.append(f"test_id '{printable(attrs['test_id'])}' holds {control}, a control, bidi or line-separator "
                   "character, which no suite can give a test id")
    if not isinstance(attrs["baseline"].get("name"), str) or not attrs["baseline"]["name"]:
        out.append("baseline has no preset name")
    return out


def _tensor_problems(tensors: dict, data_nbytes: int | None) -> list[str]:
    """Each tensor record's problems, and a packed data length other than their sum."""
    out = [m for name, rec in tensors.items() for m in record_problems(name, rec, data_nbytes)]
    if not out and data_nbytes is not None:
        # the tensors lie back to back: the data is exactly as long as they are together, so a
        # declared length can never make a reader allocate more than the tensors take
        total = sum(rec["nbytes"] for rec in tensors.values())
        if total != data_nbytes:
            out.append(f"its shape declares {data_nbytes} bytes of packed data, but its tensors take "
                       f"{total} bytes together")
    return out


def _sections(attrs: dict) -> tuple[dict[str, Any], list[str]]:
    """The structures that refer to tensors, by section name, and what is wrong with the
    reference's kind."""
    out = []
    sections = {"args": attrs["args"], "kwargs": attrs["kwargs"], "outputs": attrs["outputs"]}
    if attrs.get("grads") is not None:
        sections["grads"] = attrs["grads"]
    reference = attrs.get("reference")
    if reference is not None:
        kind = reference.get("kind")
        if kind == "float64":
            sections["reference"] = reference.get("residuals")
        elif kind == "none":
            if not isinstance(reference.get("reason"), str):
                out.append("reference of kind 'none' has no reason")
        else:
            out.append(f"reference kind {kind!r} is neither 'float64' nor 'none'")
    return sections, out


def _section_problems(attrs: dict, sections: dict[str, Any], tensors: dict, used: set[str]) -> list[str]:
    """Each section's structure checked, its tensor indices 0..n-1 and held (added to
    `used`); args a list and kwargs a dict at the top, a pair's outputs its two sides."""
    out = []
    sound = set()
    for section, structure in sections.items():
        found, indices = structure_problems(structure, section)
        out.extend(found)
        if found:
            continue
        sound.add(section)
        if sorted(indices) != list(range(len(indices))):
            out.append(f"{section}: its tensor indices {sorted(indices)[:8]} are not 0..{len(indices) - 1}, "
                       "one each")
            continue
        for i in range(len(indices)):
            name = f"{section}.{i}"
            used.add(name)
            if name not in tensors:
                out.append(f"{section} refers to tensor '{name}', which the golden does not hold")
    for section, kind in (("args", "list"), ("kwargs", "dict")):
        if section in sound and _root(attrs[section])[0] != kind:
            out.append(f"{section} must be a {kind} at its top")
    if attrs["test_type"] == "pair" and "outputs" in sound and (_dict_keys(attrs["outputs"]) or []) not in (
            ["a", "b"], ["b", "a"]):
        out.append("outputs of a pair test must be a dict of the sides 'a' and 'b'")
    return out


def _state_problems(states: dict, tensors: dict, used: set[str]) -> list[str]:
    """Each module's state entries [parameter name, tensor name], the tensors held (added to `used`)."""
    out = []
    for side, entries in states.items():
        if not isinstance(entries, list) or not all(
                isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in entries):
            out.append(f"states['{side}'] must be a list of [parameter name, tensor name] pairs")
            continue
        for param, name in entries:
            used.add(name)
            if name not in tensors:
                out.append(f"states['{side}'] parameter '{param}' refers to tensor '{name}', which the "
                           "golden does not hold")
    return out


@dataclass
class DefinitionFindings:
    """What rebuilding a golden's stored definition says. `problems`: it is corrupt.
    `stale`: its spec hash does not match the definition and the `file:` modules as they
    are now (a module changed, or the definition was edited). `unchecked`: why the spec
    hash could not be checked from here."""

    problems: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    case: Any = None


def definition_findings(test_id: str, definition: Any, suite: str, spec_hash: str,
                        test_type: str | None = None) -> DefinitionFindings:
    """Rebuild the stored definition (suite.case_from_definition) and compare its spec
    hash with the stored one. `file:` modules resolve against the stored suite path, as
    check resolves them."""
    from ..core.errors import OpdiffError
    from ..suite import case_from_definition

    found = DefinitionFindings()
    if not isinstance(definition, dict):
        found.problems.append("the stored test definition is missing")
        return found
    if set(definition) == {"pytest"}:
        found.problems.append("it was recorded by the opdiff_golden pytest fixture, which checks it when its "
                              "test runs (docs/pytest.md); it holds no suite definition to rebuild")
        return found
    try:
        case = case_from_definition(test_id, definition, Path(suite))
    except (OpdiffError, ValueError) as exc:
        found.problems.append(f"its definition does not rebuild into a test ({exc})")
        return found
    found.case = case
    if test_type is not None and case.test_type != test_type:
        found.problems.append(f"test_type is {test_type!r} but its definition is a {case.test_type} test")
    missing = [f for f in case.source_files if not f.is_file()]
    if missing:
        found.unchecked.append(f"spec hash not checked: the file: module {missing[0]} is not found from "
                               "here; run from where record ran")
    elif case.spec_hash != spec_hash:
        if not case.source_files:
            found.problems.append(f"its definition hashes to {case.spec_hash[:12]}, not to its spec_hash "
                                  f"{spec_hash[:12]}: the definition was changed after record")
        else:
            modules = ", ".join(str(f) for f in case.source_files)
            found.stale.append(f"its spec hash {spec_hash[:12]} does not match its definition and its file: "
                               f"module(s) as they are now ({case.spec_hash[:12]}; {modules}): a module "
                               "changed since record (check: STALE) or the definition was edited")
    return found


def _is_torch_dtype(name: str) -> bool:
    import torch  # only a golden whose arguments hold a dtype gets here

    return isinstance(getattr(torch, name, None), torch.dtype)
