"""Suite files -> one merged document: YAML read with positions, includes followed in
order (their tests before the including file's own), dims and presets merged. A dim or
preset defined again with the same value is fine (two suites may include one common
file); with another value it is a problem naming both places, and so is an include
cycle. Expansion into test cases is expand.py's job.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.regular_files import not_regular
from .extensions import parse_extension
from .fields import EXTENSION_KEYS, TOP_KEYS
from .files import display_path
from .problems import BAD, Problems, Where, check_keys
from .reader import SuiteReader
from .reads import note
from .resolve import NodeResolver
from .yamlload import YamlSyntaxError

EXT_DEFAULTS: dict[str, Any] = {"tolerance": {}, "seeds": [0], "tags": [], "skip": {}, "grad": False,
                               "profiles": ["normal"]}


@dataclass
class RawTest:
    raw: Any
    where: Where          # tests[i] in its own file
    index: int
    suite: Path
    defaults: dict
    chain: tuple[Path, ...] = ()    # the include path that reached it, top-level suite first


@dataclass
class Document:
    dims: dict[str, int] = field(default_factory=dict)
    dim_where: dict[str, Where] = field(default_factory=dict)
    presets: dict[str, tuple[Any, Where, Path]] = field(default_factory=dict)
    tests: list[RawTest] = field(default_factory=list)


def read_suite_file(path: Path, problems: Problems, where: Where | None = None,
                    reader: SuiteReader | None = None) -> Any:
    """The file's YAML value, or BAD (with the problem recorded). Through `reader`, a file
    is read and parsed once however often it is asked for."""
    disp = display_path(path)
    note("read", os.path.abspath(path))
    what = None if path.is_dir() else not_regular(path)
    if what is not None:
        return problems.add(where or Where(disp), f"suite file {disp}: {what}, not a regular file; name a "
                                                  "YAML file here")
    try:
        value, dups = (reader or SuiteReader()).parsed(path)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            msg = "file not found"
        elif isinstance(exc, IsADirectoryError) or path.is_dir():
            msg = "is a directory, not a YAML file; name a suite file here"
        else:
            msg = f"cannot read it ({exc.strerror or exc})"
        return problems.add(where or Where(disp), f"suite file {disp}: {msg}")
    except YamlSyntaxError as exc:
        for msg, mark in exc.problems:
            problems.add(Where(disp, mark=mark), msg)
        return BAD
    for msg, mark in dups:
        problems.add(Where(disp, mark=mark), msg)
    return value


def load_document(path: Path, problems: Problems, doc: Document, stack: tuple[Path, ...] = (),
                  defaults: dict | None = None, via: Where | None = None,
                  reader: SuiteReader | None = None) -> None:
    """Load `path` and its includes into `doc` (depth-first, includes first). `stack` is
    the chain of including files (resolved), top-level suite first."""
    reader = reader or SuiteReader()
    path = Path(os.path.normpath(path))
    real = path.resolve()
    note("resolve", path)
    found = _top_level(path, problems, stack + (real,), via, reader)
    if found is None:
        return
    data, top = found
    own = _defaults(data, top, problems, dict(defaults or EXT_DEFAULTS))
    _includes(data, top, path, problems, doc, stack + (real,), own, reader)
    _dims(data, top, problems, doc)
    _presets(data, top, path, problems, doc)
    _tests(data, top, path, problems, doc, own, stack + (real,))


def _top_level(path: Path, problems: Problems, chain: tuple[Path, ...], via: Where | None,
               reader: SuiteReader) -> tuple[dict, Where] | None:
    """The suite file's top-level mapping and where it is, its keys checked; None (the
    problem recorded) for an include cycle (`chain` ends with the file, and holds it
    before), a file that cannot be read or parsed, or a value that is no mapping."""
    disp = display_path(path)
    if chain[-1] in chain[:-1]:
        problems.add(via or Where(disp), f"include cycle: {' -> '.join(display_path(p) for p in chain)}; "
                                         "remove one of these includes")
        return None
    data = read_suite_file(path, problems, via, reader)
    if data is BAD:
        return None
    top = Where(disp, mark=getattr(data, "mark", None))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.add(top, "a suite must be a mapping with keys include, dims, presets, tests, defaults")
        return None
    check_keys(data, TOP_KEYS, top, problems, "the suite's top level")
    if not any(k in data for k in ("tests", "include", "dims", "presets")):
        problems.add(top, "the suite defines nothing: give it 'tests' (it may be an empty list), "
                          "'include', or 'dims'/'presets' for a definitions file")
    return data, top


def _defaults(data: dict, top: Where, problems: Problems, own: dict) -> dict:
    """`own` (the including file's defaults) with the suite's `defaults` over them."""
    raw_defaults = data.get("defaults")
    if raw_defaults is None:
        return own
    wd = top.at(data, "defaults")
    if not isinstance(raw_defaults, dict):
        problems.add(wd, "defaults must be a mapping of " + ", ".join(EXTENSION_KEYS))
        return own
    check_keys(raw_defaults, EXTENSION_KEYS, wd, problems, "defaults")
    for k in EXTENSION_KEYS:
        if k in raw_defaults:
            v = parse_extension(k, raw_defaults[k], wd.at(raw_defaults, k), problems, plain_number(problems))
            if v is not BAD:
                own[k] = v
    return own


def _includes(data: dict, top: Where, path: Path, problems: Problems, doc: Document, chain: tuple[Path, ...],
              own: dict, reader: SuiteReader) -> None:
    """Each included file loaded into `doc`, in order, under this file's defaults."""
    inc = data.get("include")
    if inc is None:
        return
    wi = top.at(data, "include")
    items = [inc] if isinstance(inc, str) else inc
    if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
        problems.add(wi, f"include must be a file name or a list of them, got {inc!r}")
        return
    for i, name in enumerate(items):
        w = wi if isinstance(inc, str) else wi.at(inc, i)
        load_document(path.parent / name, problems, doc, chain, own, w, reader)


def _dims(data: dict, top: Where, problems: Problems, doc: Document) -> None:
    """The suite's dims merged into `doc`'s: the same value again is fine, another a problem."""
    dims = data.get("dims")
    if dims is None:
        return
    wd = top.at(data, "dims")
    if not isinstance(dims, dict):
        problems.add(wd, f"dims must map symbols to non-negative integers, got {dims!r}")
        return
    for k, v in dims.items():
        w = wd.at(dims, k)
        if not isinstance(k, str) or not k:
            problems.add(w, f"dim name {k!r} must be a string")
        elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
            problems.add(w, f"dim '{k}' = {v!r} must be a non-negative integer")
        elif k in doc.dims:
            if doc.dims[k] != v:
                problems.add(w, f"dim '{k}' is defined as {v} here and as {doc.dims[k]} at "
                                f"{_at(doc.dim_where[k])}; keep one definition or rename one")
        else:
            doc.dims[k], doc.dim_where[k] = v, w


def _presets(data: dict, top: Where, path: Path, problems: Problems, doc: Document) -> None:
    """The suite's presets merged into `doc`'s, as dims are."""
    presets = data.get("presets")
    if presets is None:
        return
    wp = top.at(data, "presets")
    if not isinstance(presets, dict):
        problems.add(wp, f"presets must map names to nodes, got {presets!r}")
        return
    for k, v in presets.items():
        w = wp.at(presets, k)
        if k in doc.presets:
            if plain_equal(doc.presets[k][0], v):
                continue
            problems.add(w, f"preset '{k}' is defined here and differently at "
                            f"{_at(doc.presets[k][1])}; keep one definition or rename one")
        else:
            doc.presets[str(k)] = (v, w, path.parent)


def _tests(data: dict, top: Where, path: Path, problems: Problems, doc: Document, own: dict,
           chain: tuple[Path, ...]) -> None:
    """The suite's tests appended to `doc`'s, raw, each with its place and defaults."""
    tests = data.get("tests")
    if tests is None:
        return
    wt = top.at(data, "tests")
    if not isinstance(tests, list):
        problems.add(wt, f"tests must be a list, got {type(tests).__name__}")
        return
    for i, t in enumerate(tests):
        doc.tests.append(RawTest(t, wt.at(tests, i), i, path, own, chain))


def _at(w: Where) -> str:
    return f"{w.file}:{w.mark[0]}" if w.mark else w.file


def plain_equal(a: Any, b: Any) -> bool:
    """Equal as YAML values (positions ignored; 1 and 1.0 and True kept apart)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def chain_text(chain: tuple[Path, ...]) -> str:
    return " -> ".join(display_path(p) for p in chain)


def plain_number(problems: Problems):
    """A numeric-field parser outside any node (defaults, test extensions)."""
    return NodeResolver(problems, {}, [], lambda n, w: BAD, lambda p, w, m: p).num
