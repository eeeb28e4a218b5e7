"""Suite files -> TestCases: each top-level suite read with its includes (document.py) and
expanded (expand.py), or taken from the suite cache while nothing it was made from changed
(cache.py); then test ids checked unique across all of them. Every problem of every file
is raised at once, in one SuiteError."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..core.errors import OpdiffError, SuiteError
from .document import Document, chain_text, load_document
from .expand import Expander, assemble_case
from .files import SearchRoots, display_path
from .model import TestCase
from .problems import Problems, Where
from .reader import SuiteReader
from .reads import noting
from .yamlload import gc_paused


@dataclass(frozen=True)
class Origin:
    """Where a test came from: its file, its place in that file's tests, and the include
    chain (resolved, top-level suite first) that reached it."""

    suite: Path
    index: int
    chain: tuple[Path, ...]


def load_suites(paths: Sequence[Path], check_names: bool = True, reader: SuiteReader | None = None
                ) -> list[TestCase]:
    """Load, validate and expand suites; every problem of every file in one SuiteError.
    `check_names=False` leaves out resolving op names and dotted paths (which imports
    torch), for a caller that wants only ids and spec hashes (the goldens' states).
    `reader`: the command's reads (each file read once), and its suite cache if it has one."""
    reader = reader or SuiteReader()
    problems = Problems()
    import_cache: dict = {}
    cases: list[TestCase] = []
    seen: dict[str, tuple[TestCase, Origin]] = {}
    for p in paths:
        with gc_paused():
            found = _expanded(Path(p), reader, problems, import_cache, check_names)
        for case, origin in found:
            if case.id in seen:
                first = seen[case.id][1]
                if first.chain != origin.chain and first.suite == origin.suite and first.index == origin.index:
                    why = (f"the same test reached twice, through {chain_text(first.chain)} and "
                           f"{chain_text(origin.chain)}; include that file once, from a file both include")
                else:
                    why = (f"also defined in {display_path(seen[case.id][0].suite)}"
                           f" (reached through {chain_text(first.chain)}); give one of them another id")
                problems.add(Where(display_path(case.suite), test_id=case.id),
                             f"duplicate test id '{case.id}': {why}")
                continue
            seen[case.id] = (case, origin)
            cases.append(case)
    if len(problems):
        raise SuiteError(list(problems))
    return cases


def _expanded(path: Path, reader: SuiteReader, problems: Problems, import_cache: dict, check_names: bool
              ) -> list[tuple[TestCase, Origin]]:
    """One top-level suite's tests, with the problems of its expansion added to `problems`."""
    roots = SearchRoots.for_suite(path)
    if reader.cache is not None:
        kept = _from_cache(reader, path, check_names, roots)
        if kept is not None:
            return kept
    own = Problems()   # this suite's alone: only one that has none is kept
    with noting() as seen:
        doc = Document()
        load_document(path, own, doc, reader=reader)
        found = [(case, Origin(rt.suite, rt.index, rt.chain))
                 for case, rt in Expander(doc, own, import_cache, roots, check_names).cases()]
    problems.extend(own)
    if reader.cache is not None and not len(own):
        reader.cache.store(path, check_names, roots, [_record(case, origin) for case, origin in found], seen)
    return found


def _record(case: TestCase, origin: Origin) -> dict:
    return {"id": case.id, "suite": str(origin.suite), "index": origin.index,
            "chain": [str(p) for p in origin.chain], "definition": case.definition,
            "spec_hash": case.spec_hash, "source_files": [str(p) for p in case.source_files]}


def _from_cache(reader: SuiteReader, path: Path, check_names: bool, roots: SearchRoots
                ) -> list[tuple[TestCase, Origin]] | None:
    assert reader.cache is not None
    tests = reader.cache.expansion(path, check_names, roots)
    if tests is None:
        return None
    import_dirs, paths = roots.import_dirs, {}   # Path objects made once per suite

    def as_path(name: str) -> Path:
        if name not in paths:
            paths[name] = Path(name)
        return paths[name]
    try:
        return [(assemble_case(t["id"], t["definition"], as_path(t["suite"]), tuple(map(as_path, t["source_files"])),
                               t["spec_hash"], import_dirs),
                 Origin(as_path(t["suite"]), t["index"], tuple(map(as_path, t["chain"])))) for t in tests]
    except (KeyError, TypeError, AttributeError, ValueError, OpdiffError):
        return None   # another shape: expanded afresh, and kept again


def line_of_test(suite: Path | str, test_id: str) -> int | None:
    """The line of `suite` where the test `test_id` is written: the entry of its `tests`
    whose id is the test's, or the longest that a parametrized id starts with (None: not
    found, or the file does not read)."""
    try:
        st = Path(suite).stat()
    except OSError:
        return None
    lines = _test_lines(str(suite), st.st_mtime_ns, st.st_size)
    if test_id in lines:
        return lines[test_id]
    bases = [tid for tid in lines if test_id.startswith(tid + "__")]
    return lines[max(bases, key=len)] if bases else None


@functools.lru_cache(maxsize=32)
def _test_lines(suite: str, mtime_ns: int, size: int) -> dict[str, int]:
    """{id: line} of the entries of a suite file's `tests` (read once per version of it)."""
    from .yamlload import YamlSyntaxError, load_yaml_text, read_yaml_file

    try:
        data, _ = load_yaml_text(read_yaml_file(Path(suite)))
    except (OSError, YamlSyntaxError):
        return {}
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, list):
        return {}
    out: dict[str, int] = {}
    for i, entry in enumerate(tests):
        tid = entry.get("id") if isinstance(entry, dict) else None
        mark = getattr(tests, "marks", {}).get(i)
        if isinstance(tid, str) and mark is not None:
            out.setdefault(tid, mark[0])
    return out
