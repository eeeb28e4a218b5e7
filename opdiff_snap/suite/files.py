"""Where `file:` modules are found, and what is importable while one is imported.

A `file:` path is looked up, in order, relative to: the folder of the suite file that
names it, the current directory (opdiff resolves against it, so suites written from a
repository root keep working), the folder of the top-level suite being run, and the
project root (the nearest folder above that suite holding `pyproject.toml` or `.git`).
Once found, the path is rewritten relative to the suite's folder: that canonical form
is what definitions, spec hashes and goldens hold, so a golden does not depend on
where a run was started.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import OpdiffError
from .reads import note

PROJECT_MARKERS = ("pyproject.toml", ".git")


def project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` holding a project marker."""
    start = Path(os.path.abspath(start))
    for d in (start, *start.parents):
        if any((d / m).exists() for m in PROJECT_MARKERS):
            return d
    return None


def _unique(paths) -> tuple[Path, ...]:
    out: dict[Path, None] = {}
    for p in paths:
        if p is not None:
            out[Path(os.path.abspath(p))] = None
    return tuple(out)


@dataclass(frozen=True)
class SearchRoots:
    """The folders a run looks in besides each suite's own, in order."""

    cwd: Path
    tree_root: Path | None = None       # folder of the top-level suite
    project: Path | None = None         # see project_root()

    @classmethod
    def for_suite(cls, top_level_suite: Path) -> "SearchRoots":
        top = Path(os.path.abspath(top_level_suite)).parent
        return cls(cwd=Path.cwd(), tree_root=top, project=project_root(top))

    def lookup_dirs(self, suite_dir: Path) -> tuple[Path, ...]:
        return _unique((suite_dir, self.cwd, self.tree_root, self.project))

    @property
    def import_dirs(self) -> tuple[Path, ...]:
        """What `import examples.x` inside a `file:` module may resolve against."""
        return _unique((self.project, self.cwd))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def display_path(path: Path) -> str:
    """A path as messages show it: relative to the current directory unless that climbs
    two or more levels, then absolute."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("../..") else str(path)


def find_file(rel: str, suite_dir: Path, roots: SearchRoots) -> Path:
    """The one file `rel` names. Several different files -> ambiguity error naming each;
    none -> error naming every place tried."""
    if os.path.isabs(rel):
        candidates = [Path(rel)]
    else:
        candidates = [d / rel for d in roots.lookup_dirs(suite_dir)]
    for c in candidates:
        note("probe", os.path.abspath(c))
    found = [Path(os.path.normpath(c)) for c in candidates if c.is_file()]
    for f in found:
        note("read", os.path.abspath(f))
    if not found:
        tried = ", ".join(display_path(Path(os.path.normpath(c))) for c in candidates)
        raise OpdiffError(f"file:{rel}: file not found; looked in {tried}. Write the path relative to the "
                          "suite file or to the repository root.")
    distinct: dict[str, Path] = {}
    for f in found:
        distinct.setdefault(_digest(f), f)
    if len(distinct) > 1:
        places = ", ".join(display_path(f) for f in found)
        raise OpdiffError(f"file:{rel} is ambiguous: it names different files at {places}. Make the path "
                          "unambiguous (relative to the suite file, e.g. with ./ or ../), or remove the "
                          "stray copy.")
    return found[0]


def split_file_path(path: str) -> tuple[str, str]:
    """`file:rel/x.py::Name` -> ("rel/x.py", "Name")."""
    body = path[len("file:"):]
    file, sep, name = body.partition("::")
    if not sep or not file or not name:
        raise OpdiffError(f"'{path}' is not a valid file path: write it as file:relative/file.py::Name.")
    return file, name
