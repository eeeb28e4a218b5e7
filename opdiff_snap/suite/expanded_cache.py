"""Expanded suites kept on disk, used while everything they were made from is unchanged.

One entry per top-level suite file, as a run from its folder names it, under
`<cache>/suites/`, in JSON (never a pickle). An entry holds:

- the key it was made under: the entry format, opdiff-snap's version and a digest of the
  source of suite/ and core/, the Python and the distributions installed in the
  site-packages folders on its path, the search roots of `file:` modules, whether names
  were checked, the suite file's digest;
- what its expansion looked at (suite/reads.py), each with what it found: the bytes of
  every suite file it includes and of every `file:` module (what spec hashes read),
  whether each place a module was looked for held a file, where each link led, where each
  package was found;
- its tests: id, where each came from, definition, spec hash, `file:` modules.

An entry is used only when its key is the same and every observation finds the same
again. A file inside an installed distribution (site-packages) is taken as its version
says, which the key holds; an expansion that read a whole folder outside one is not kept.
Only a suite that expanded without a problem is kept, so a suite with problems is
expanded afresh and reports them exactly as a fresh load does. An entry that cannot be
read or has another shape is ignored and written again.

Discovery keeps one entry per folder: each suite file's digest and the files it includes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from .. import __version__
from ..core.jsonvalues import loads_or_none
from ..core.limits import MAX_NESTING
from ..core.regular_files import read_bounded
from ..storage.local import write_json_whole
from .files import SearchRoots
from .reads import Observation

FORMAT = 1
_COVERED = ("site-packages", "dist-packages")
_DISTRIBUTIONS = (".dist-info", ".egg-info", ".egg-link", ".pth")


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """opdiff-snap's version and the source of what reads and expands suites (suite/, core/)."""
    h = hashlib.sha256(__version__.encode())
    package = Path(__file__).parent.parent
    for path in sorted([*package.joinpath("suite").glob("*.py"), *package.joinpath("core").glob("*.py")]):
        h.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _installed_dirs() -> list[str]:
    return [os.path.abspath(p) for p in sys.path if p and os.path.basename(os.path.normpath(p)) in _COVERED]


def environment_digest() -> str:
    """The interpreter, and the distributions installed in the site-packages folders on its
    import path (where a package is found is an observation of its own)."""
    h = hashlib.sha256(sys.version.encode())
    for folder in _installed_dirs():
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(_DISTRIBUTIONS))
        except OSError:
            names = ["\0unreadable"]
        h.update(json.dumps([folder, names]).encode())
    return h.hexdigest()


class Digests(Protocol):
    def digest(self, path: Path | str) -> str | None: ...


class SuiteCache:
    """The suite entries under one cache folder, through one command's reads (suite/reader.py)."""

    def __init__(self, folder: Path, reader: Digests):
        self.folder = Path(folder) / "suites"
        self.reader = reader
        self._environment: str | None = None
        self._installed = tuple(d + os.sep for d in _installed_dirs())

    # ---------------------------------------------------------------- expanded suites

    def key(self, path: Path, check_names: bool, roots: SearchRoots) -> dict[str, Any] | None:
        digest = self.reader.digest(path)
        if digest is None:
            return None
        if self._environment is None:
            self._environment = environment_digest()
        return {"format": FORMAT, "code": code_digest(), "environment": self._environment,
                "path": os.path.normpath(path), "roots": [str(r) for r in (roots.cwd, roots.tree_root, roots.project)],
                "check_names": check_names, "digest": digest}

    def _entry_path(self, path: Path, check_names: bool) -> Path:
        name = json.dumps([os.path.normpath(path), os.getcwd(), check_names])
        return self.folder / f"{hashlib.sha256(name.encode()).hexdigest()[:40]}.json"

    def expansion(self, path: Path, check_names: bool, roots: SearchRoots) -> list[dict[str, Any]] | None:
        """The stored tests of `path` (each {"id", "suite", "index", "chain", "definition",
        "spec_hash", "source_files"}), or None when there is no entry still true."""
        key = self.key(path, check_names, roots)
        entry = _read_json(self._entry_path(path, check_names)) if key is not None else None
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        deps, tests = entry.get("depends"), entry.get("tests")
        if not isinstance(deps, list) or not isinstance(tests, list) or not all(map(_test_shaped, tests)):
            return None
        for dep in deps:
            if not (isinstance(dep, list) and len(dep) == 3 and dep[0] in _LOOKS):
                return None
            if self._look(dep[0], dep[1]) != dep[2]:
                return None
        return tests

    def store(self, path: Path, check_names: bool, roots: SearchRoots, tests: Sequence[dict[str, Any]],
              seen: Iterable[Observation]) -> None:
        """Keep an expansion that had no problem; quietly nothing when it cannot be kept."""
        key = self.key(path, check_names, roots)
        deps = self._depends(seen)
        if key is None or deps is None:
            return
        write_json_whole(self._entry_path(path, check_names), {"key": key, "depends": deps, "tests": list(tests)})

    def _depends(self, seen: Iterable[Observation]) -> list[list[Any]] | None:
        out = []
        for kind, what in dict.fromkeys(seen):
            if kind in ("read", "probe", "walk"):
                what = os.path.abspath(what)
                if what.startswith(self._installed):
                    continue   # the distribution's version, in the key, stands for its files
            if kind == "walk":
                return None    # a whole folder of the user's: not worth watching
            out.append([kind, what, self._look(kind, what)])
        return out

    def _look(self, kind: str, what: Any) -> Any:
        """What an observation finds now."""
        if not isinstance(what, str):
            return None
        if kind == "read":
            return self.reader.digest(what)
        if kind == "probe":
            return os.path.isfile(what)
        if kind == "resolve":
            return str(Path(what).resolve())
        if kind != "spec" or not what.isidentifier():
            return None   # only a top-level name is looked up: a dotted one would import its parents
        try:
            spec = importlib.util.find_spec(what)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        # as text: a package's search path may hold Path objects, which JSON would refuse
        origin = None if spec.origin is None else str(spec.origin)
        return [origin, [str(p) for p in spec.submodule_search_locations or []]]

    # ---------------------------------------------------------------- discovery

    def includes(self, root: Path, files: Sequence[Path], parse: Callable[[Path], list[str]]
                 ) -> dict[Path, list[str]]:
        """Each file's include names: stored ones for files whose bytes are unchanged,
        `parse(file)` for the others (and the folder's entry written again)."""
        entry_path = self.folder / f"discover-{hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:40]}.json"
        entry = _read_json(entry_path)
        known = entry.get("files") if isinstance(entry, dict) and entry.get("code") == code_digest() else None
        known = known if isinstance(known, dict) else {}
        out: dict[Path, list[str]] = {}
        fresh: dict[str, list[Any]] = {}
        for f in files:
            name, digest = os.path.abspath(f), self.reader.digest(f)
            stored = known.get(name)
            if (digest is not None and isinstance(stored, list) and len(stored) == 2 and stored[0] == digest
                    and isinstance(stored[1], list) and all(isinstance(n, str) for n in stored[1])):
                out[f] = stored[1]
            else:
                out[f] = parse(f)
            if digest is not None:
                fresh[name] = [digest, out[f]]
        if fresh != known:
            write_json_whole(entry_path, {"code": code_digest(), "files": fresh})
        return out


_LOOKS = ("read", "probe", "resolve", "spec")
_TEST_FIELDS = {"id": str, "suite": str, "index": int, "chain": list, "definition": dict, "spec_hash": str,
                "source_files": list}


def _test_shaped(test: Any) -> bool:
    return (isinstance(test, dict) and all(isinstance(test.get(k), t) for k, t in _TEST_FIELDS.items())
            and all(isinstance(p, str) for p in test["chain"] + test["source_files"]))


MAX_ENTRY_BYTES = 256 << 20


def _read_json(path: Path) -> Any:
    """An entry's value, or None where it cannot be one: not a regular file (a FIFO, a
    link to a device), larger than MAX_ENTRY_BYTES, not JSON, nested deeper than a suite can."""
    try:
        data = read_bounded(path, MAX_ENTRY_BYTES, "cache entry", follow=False)
    except OSError:
        return None
    return loads_or_none(data, MAX_NESTING + 16)   # an entry's tests hold a suite's values a few levels down
