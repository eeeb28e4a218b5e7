"""What the package imports is what it declares, and the lock honours the declared ranges.

A module that arrives only as some other package's dependency (a checksum library that
zarr happens to pull in) works until that package changes its own requirements; so
every import in opdiff_snap/ must come from a distribution named in pyproject.toml."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _check_lock():
    """tools/check_lock.py, which reads the lock for CI."""
    spec = importlib.util.spec_from_file_location("check_lock", REPO / "tools" / "check_lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def declared() -> dict[str, Requirement]:
    """Every requirement of the package, core and extras, by canonical name
    (self-references such as opdiff-snap[all] left out)."""
    reqs = list(PROJECT["dependencies"])
    for extra in PROJECT["optional-dependencies"].values():
        reqs.extend(extra)
    out = {}
    for text in reqs:
        req = Requirement(text)
        if canonicalize_name(req.name) != canonicalize_name(PROJECT["name"]):
            out[canonicalize_name(req.name)] = req
    return out


def imported_modules() -> dict[str, list[str]]:
    """Top-level module -> the files of opdiff_snap that import it (anywhere in the file)."""
    out: dict[str, list[str]] = {}
    for path in sorted((REPO / "opdiff_snap").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                # a bundle runner's sibling script (bundle_io) travels with it, outside any package
                sibling = (path.parent / f"{top}.py").exists()
                if top not in sys.stdlib_module_names and top != "opdiff_snap" and not sibling:
                    out.setdefault(top, []).append(str(path.relative_to(REPO)))
    return out


def test_every_import_comes_from_a_declared_distribution():
    providers = importlib.metadata.packages_distributions()
    names = declared()
    undeclared = []
    for module, files in sorted(imported_modules().items()):
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        if not dists:
            undeclared.append(f"{module} (imported by {files[0]}) is not installed at all")
        elif not dists & set(names):
            undeclared.append(f"{module} (imported by {files[0]}) comes from {sorted(dists)}, "
                              "which pyproject.toml does not declare")
    assert not undeclared, "\n".join(undeclared)


def test_the_walk_sees_the_imports_it_must():
    """The import walk itself: it finds imports made inside functions too."""
    modules = imported_modules()
    for module in ("torch", "zarr", "google_crc32c", "onnxruntime", "executorch", "boto3"):
        assert module in modules, module


def test_the_lock_pins_every_declared_requirement_within_its_range():
    """Users get ranges, development gets the lock: each declared range admits the
    locked version, so the lock is one of the environments users can have."""
    lock = REPO / "requirements.lock"
    locked = _check_lock().pins(lock.read_text().splitlines(), str(lock))   # the reader CI uses
    problems = []
    for name, req in declared().items():
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if name not in locked:
            problems.append(f"{name} is declared but not in requirements.lock")
        elif not req.specifier.contains(locked[name], prereleases=True):
            problems.append(f"{name}=={locked[name]} in the lock is outside the declared '{req.specifier}'")
    assert not problems, "\n".join(problems)


def test_requires_python_matches_what_the_code_uses():
    """tomllib is 3.11+; the package says so, and the linters check the code as 3.11 code."""
    assert PROJECT["requires-python"] == ">=3.11"
    tools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
    assert tools["ruff"]["target-version"] == "py311"
    assert tools["mypy"]["python_version"] == "3.11"
