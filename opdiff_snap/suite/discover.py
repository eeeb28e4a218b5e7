"""Which suite files a run reads: the files named, or every suite under a directory that
no other file there includes (an orchestrator runs its includes once). Through a reader
with a cache, a file whose bytes are unchanged is not parsed again to learn its includes."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..core.errors import OpdiffError
from ..core.regular_files import not_regular
from .document import read_suite_file
from .problems import Problems
from .reader import SuiteReader


def discover_suites(root: Path, reader: SuiteReader | None = None) -> list[Path]:
    """Every *.yaml/*.yml under root that no other file there includes."""
    root = Path(root)
    if root.is_file():
        return [root]
    reader = reader or SuiteReader()
    files = sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())

    def include_names(f: Path) -> list[str]:
        value = read_suite_file(f, Problems(), reader=reader)
        inc = value.get("include") if isinstance(value, dict) else None
        return [n for n in ([inc] if isinstance(inc, str) else inc if isinstance(inc, list) else [])
                if isinstance(n, str)]

    names = reader.cache.includes(root, files, include_names) if reader.cache else {f: include_names(f) for f in files}
    included: set[Path] = set()
    for f in files:
        for name in names[f]:
            included.add((f.parent / name).resolve())
    return [f for f in files if f.resolve() not in included]


def suite_paths(paths: Sequence[Path] | None, default_dir: Path, reader: SuiteReader | None = None) -> list[Path]:
    """The suite files named (directories expanded), or every suite under `default_dir`."""
    if paths:
        out: list[Path] = []
        for p in map(Path, paths):
            if not p.exists():
                raise OpdiffError(f"suite file not found: {p}. Give a path to a YAML suite or a "
                                  "directory of suites.")
            what = None if p.is_dir() else not_regular(p)
            if what is not None:
                raise OpdiffError(f"suite {p} is {what}, not a YAML file or a directory of suites; give "
                                  "a suite file or a directory.")
            found = discover_suites(p, reader)
            if p.is_dir() and not found:
                raise OpdiffError(f"{p} is a directory holding no YAML suite (no *.yaml or *.yml file "
                                  "in it or below it). Give suite files, or a directory that has some.")
            out.extend(found)
        return out
    default_dir = Path(default_dir)
    if default_dir.exists() and not default_dir.is_dir():
        raise OpdiffError(f"the suites directory {default_dir} is a file: --suites (or [tool.opdiff] "
                          "suites) names the directory of suites. To use one suite file, pass it as an "
                          "argument instead.")
    return discover_suites(default_dir, reader) if default_dir.is_dir() else []
