"""api.py defines each public function itself (or imports it under its own name), runs
its stage by importing it when called, and forwards only what the stage accepts."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

from opdiff_snap import api

API = Path(api.__file__)


def _stage_calls() -> dict[str, tuple[str, str, ast.Call]]:
    """api function -> (stage module, function, the call of it) for each function whose body
    imports one stage function and calls it."""
    out = {}
    for node in ast.parse(API.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        imports = [n for n in ast.walk(node) if isinstance(n, ast.ImportFrom) and n.level == 1]
        if len(imports) != 1 or len(imports[0].names) != 1:
            continue
        alias = imports[0].names[0]
        local = alias.asname or alias.name
        calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == local]
        if calls:
            out[node.name] = (f"opdiff_snap.{imports[0].module}", alias.name, calls[0])
    return out


def test_every_public_name_is_itself():
    """No renaming table and no module __getattr__: `api.localize` is a function named
    localize, found where "go to definition" looks."""
    assert not hasattr(api, "__getattr__")
    for name in api.__all__:
        value = getattr(api, name)
        assert callable(value), name
        assert value.__name__ == name, f"api.{name} is {value.__name__}"


def test_every_wrapper_forwards_what_its_stage_takes():
    calls = _stage_calls()
    assert {"check", "record", "localize", "query", "goldens"} <= set(calls)
    for name, (module, attr, call) in calls.items():
        stage = inspect.signature(getattr(importlib.import_module(module), attr))
        params = stage.parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        named = {k.arg for k in call.keywords}
        assert named <= set(params), f"api.{name} passes {sorted(named - set(params))}, which {module}.{attr} lacks"
        positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(call.args) <= len(positional), f"api.{name} passes {len(call.args)} positional arguments"


def test_importing_the_api_imports_no_stage():
    """The stages are imported by the calls that need them (torch, DuckDB, the backends)."""
    probe = "import json, sys, opdiff_snap.api; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(out.stdout))
    assert not {"torch", "duckdb"} & loaded
    stages = {m for m, _, _ in _stage_calls().values() if not importlib.util.find_spec(m).submodule_search_locations}
    assert "opdiff_snap.run.check" in stages
    assert not stages & loaded
