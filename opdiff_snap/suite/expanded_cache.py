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

The cache is a speed-up, never a source of truth: whoever can write to its folder (a
cloned repository that ships `.opdiff-cache/`, a shared folder) could edit an entry, key
and all. So every entry is signed with this user's key, which no cache holds
(core/signing.py), and one whose signature does not match what it holds is ignored with a
warning naming it: the suite is expanded afresh, exactly as a fresh load reads it, and the
entry written again. Only a regular file of at most MAX_ENTRY_BYTES is read. Where there is
no key (it cannot be made, or is not a private file of the user's), nothing is kept or used.

Discovery keeps one entry per folder: each suite file's digest and the files it includes.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from .. import __version__
from ..core.jsonvalues import loads_or_none
from ..core.limits import MAX_NESTING
from ..core.regular_files import read_regular
from ..core.signing import key_path, signed, user_key, verified
from ..storage.local import write_bytes_whole
from .files import SearchRoots
from .reads import Observation

FORMAT = 2
MAX_ENTRY_BYTES = 256 << 20
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

    def __init__(self, folder: Path, reader: Digests, warn: Callable[[str], None] | None = None):
        self.folder = Path(folder) / "suites"
        self.reader = reader
        self.warn = warn or _python_warning
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
        name = json.dumps([FORMAT, os.path.normpath(path), os.getcwd(), check_names])
        return self.folder / f"{hashlib.sha256(name.encode()).hexdigest()[:40]}.json"

    def expansion(self, path: Path, check_names: bool, roots: SearchRoots) -> list[dict[str, Any]] | None:
        """The stored tests of `path` (each {"id", "suite", "index", "chain", "definition",
        "spec_hash", "source_files"}), or None when there is no entry still true."""
        key = self.key(path, check_names, roots)
        entry = self._read(self._entry_path(path, check_names), path) if key is not None else None
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
        watched = {dep[1] for dep in deps if dep[0] == "read"}
        for test in tests:   # every `file:` module a test names is one whose bytes are watched
            if any(os.path.abspath(f) not in watched and not os.path.abspath(f).startswith(self._installed)
                   for f in test["source_files"]):
                return None
        return tests

    def store(self, path: Path, check_names: bool, roots: SearchRoots, tests: Sequence[dict[str, Any]],
              seen: Iterable[Observation]) -> None:
        """Keep an expansion that had no problem; quietly nothing when it cannot be kept."""
        key = self.key(path, check_names, roots)
        deps = self._depends(seen)
        if key is None or deps is None:
            return
        self._write(self._entry_path(path, check_names), {"key": key, "depends": deps, "tests": list(tests)})

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

    # ---------------------------------------------------------------- signed entries

    def _key(self) -> bytes | None:
        key = user_key()
        if key is None:
            _once(self.warn, f"the suite cache under {self.folder} is not used: its signing key {key_path()} cannot "
                             "be made, or is not a private 32-byte file of yours (mode 0600); remove it and a new "
                             "one is made on the next run")
        return key

    def _write(self, path: Path, value: Any) -> None:
        key = self._key()
        try:
            body = json.dumps(value, separators=(",", ":"), allow_nan=True).encode()
        except (ValueError, TypeError):
            return
        if key is not None:
            write_bytes_whole(path, signed(key, body))

    def _read(self, path: Path, source: Path) -> Any:
        """The value of the entry at `path` when this user's key signed it; None when there is
        none, or (with a warning naming it) it is not signed so."""
        data = read_regular(path, MAX_ENTRY_BYTES)
        key = self._key() if data is not None else None
        if data is None or key is None:
            return None
        body = verified(key, data)
        if body is None:
            self.warn(f"the suite cache entry {path} does not carry your opdiff-snap's signature (it was edited, or "
                      f"written by someone else): it is ignored, {source} is read afresh and the entry written "
                      f"again. If this recurs, someone else writes to {self.folder}: keep the cache (--cache) "
                      "where only you can write.")
            return None
        return loads_or_none(body, MAX_NESTING + 16)   # an entry's tests hold a suite's values a few levels down

    # ---------------------------------------------------------------- discovery

    def includes(self, root: Path, files: Sequence[Path], parse: Callable[[Path], list[str]]
                 ) -> dict[Path, list[str]]:
        """Each file's include names: stored ones for files whose bytes are unchanged,
        `parse(file)` for the others (and the folder's entry written again)."""
        name = json.dumps([FORMAT, os.path.abspath(root)])
        entry_path = self.folder / f"discover-{hashlib.sha256(name.encode()).hexdigest()[:40]}.json"
        entry = self._read(entry_path, root)
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
            self._write(entry_path, {"code": code_digest(), "files": fresh})
        return out


_LOOKS = ("read", "probe", "resolve", "spec")
_TEST_FIELDS = {"id": str, "suite": str, "index": int, "chain": list, "definition": dict, "spec_hash": str,
                "source_files": list}


def _test_shaped(test: Any) -> bool:
    return (isinstance(test, dict) and all(isinstance(test.get(k), t) for k, t in _TEST_FIELDS.items())
            and all(isinstance(p, str) for p in test["chain"] + test["source_files"]))


def _python_warning(text: str) -> None:
    warnings.warn(text, RuntimeWarning, stacklevel=4)


_WARNED: set[str] = set()


def _once(warn: Callable[[str], None], text: str) -> None:
    if text not in _WARNED:
        _WARNED.add(text)
        warn(text)
