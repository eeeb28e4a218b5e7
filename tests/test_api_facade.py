"""api.py names each stage's function and imports it on first use: what the type checker
reads (the TYPE_CHECKING imports) is what a caller gets, and every public name resolves."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

from opdiff_snap import api

API = Path(api.__file__)


def _typed_imports() -> dict[str, tuple[str, str]]:
    """name in api -> (module under opdiff_snap, its name there), from the TYPE_CHECKING block."""
    tree = ast.parse(API.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    out = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for alias in node.names:
            out[alias.asname or alias.name] = (node.module, alias.name)
    return out


def test_every_lazy_name_is_the_function_the_type_checker_sees():
    typed = _typed_imports()
    for name, where in api._STAGES.items():
        assert typed.get(name) == where, f"api.{name}: {where} at run time, {typed.get(name)} for the type checker"


def test_every_public_name_resolves():
    for name in api.__all__:
        value = getattr(api, name)
        assert callable(value), name
        if name in api._STAGES:
            module, attr = api._STAGES[name]
            assert inspect.getmodule(value).__name__ == f"opdiff_snap.{module}", name


def test_importing_the_api_imports_no_stage():
    """The stages are imported by the calls that need them (torch, DuckDB, the backends)."""
    probe = "import json, sys, opdiff_snap.api; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(out.stdout))
    assert not {"torch", "duckdb"} & loaded
    assert not {f"opdiff_snap.{module}" for module, _ in api._STAGES.values()} & loaded
