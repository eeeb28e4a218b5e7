"""Python source for a repro script (cause/repro.py): stored values, constructor nodes and
ATen node arguments written as expressions, with the imports they need."""

from __future__ import annotations

import math
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from ..core.errors import OpdiffError
from ..suite.construct import split_file_path
from ..suite.locate import package_files
from ..suite.model import Node, TestCase

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def tuple_source(parts: list[str]) -> str:
    """A tuple display of the given expressions (a one-element tuple keeps its comma)."""
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def literal(v: Any) -> str:
    """A constant of an ATen node's arguments as Python source."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(literal(x) for x in v) + "]"
    if isinstance(v, tuple):
        return tuple_source([literal(x) for x in v])
    raise OpdiffError(f"an argument of type {type(v).__name__} ({v!r}) cannot be written into a repro script.")


class CaseSource:
    """Renders a test's stored values and constructor nodes as Python source, collecting
    the imports they need (a `file:` module is copied beside the script)."""

    def __init__(self, case: TestCase, out_dir: Path):
        self.case, self.out_dir = case, out_dir
        self.imports: list[str] = []
        self.copied: list[Path] = []

    def _add(self, line: str) -> None:
        if line not in self.imports:
            self.imports.append(line)

    def value(self, s: Any) -> str:
        """A trees structure node; tensor leaves become t[i]."""
        ((kind, v),) = s.items()
        if kind == "tensor":
            return f"t[{v}]"
        if kind == "tuple":
            return tuple_source([self.value(e) for e in v])
        if kind == "list":
            return "[" + ", ".join(self.value(e) for e in v) + "]"
        if kind == "dict":
            return "{" + ", ".join(f"{k!r}: {self.value(e)}" for k, e in v) + "}"
        if kind == "dtype":
            return f"torch.{v}"
        if kind == "float":
            return f"float({v!r})"
        return repr(v)

    def node(self, n: Node) -> str:
        """A constructor argument node."""
        kind = n.get("type")
        if kind == "const":
            return repr(n["value"])
        if kind == "int_list":
            return repr(list(n["elems"]))
        if kind == "tuple":
            return tuple_source([self.node(e) for e in n["elems"]])
        if kind in ("construct", "module"):
            return self.constructor(n["path"], n.get("args", []), n.get("kwargs", {}), n.get("config"))
        raise OpdiffError(f"test '{self.case.id}': cannot write a repro for a module whose constructor "
                          f"takes a sampled '{kind}' value; reproduce it with `opdiff check` instead.")

    def constructor(self, path: str, args, kwargs, config=None) -> str:
        """`path(*args, **kwargs)`, or with a config `path(path.config_class(**config), ...)`."""
        name = self.import_name(path)
        parts = [self.node(a) for a in args] + [f"{k}={self.node(v)}" for k, v in kwargs.items()]
        if config is not None:
            parts.insert(0, f"{name}.config_class(**{dict(config)!r})")
        return f"{name}({', '.join(parts)})"

    def import_name(self, path: str) -> str:
        if path.startswith("file:"):
            rel, name = split_file_path(path)
            src = (self.case.suite_dir / rel).resolve()
            stem = re.sub(r"\W", "_", src.stem)
            if not stem.isidentifier() or stem in sys.stdlib_module_names or stem in ("torch", "repro"):
                stem = f"user_{stem}"
            dest = self.out_dir / f"{stem}.py"
            if src != dest.resolve():
                shutil.copyfile(src, dest)
            self.copied.append(dest)
            self._add("sys.path.insert(0, str(HERE))  # the test's own module file, copied beside this script")
            self._add(f"from {stem} import {name}")
            return name
        if not _DOTTED.fullmatch(path):
            raise OpdiffError(f"test '{self.case.id}': '{path}' is not a dotted import path; no repro "
                              "script is written for it.")
        module_name, _, attr = path.rpartition(".")
        if package_files(module_name) or module_name.split(".")[0] == "torch":
            self._add(f"from {module_name} import {attr}")   # a module: import the name from it
            return attr
        head = module_name.split(".")[0]                     # a class attribute path: import its package
        self._add(f"import {head}")
        return path

