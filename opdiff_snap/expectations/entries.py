"""Known results that are not PASS, as data: one expectation says that a preset (or a glob
of presets) gives a test (or a glob of tests), at one seed or every seed, a verdict, why,
and for which library versions that holds.

Matching picks, of the expectations that name a result, the most specific: the test's own
id before a glob, the preset's own name before a glob, one seed before every seed. An
expectation whose version range does not hold for this environment has expired: it
excuses nothing, and is reported as expired.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..core.verdicts import Verdict

GLOB_CHARS = frozenset("*?[")


def is_glob(pattern: str) -> bool:
    return not GLOB_CHARS.isdisjoint(pattern)


def bracket_problem(pattern: str) -> str | None:
    """Why `pattern`'s brackets do not pair as fnmatch reads them (a class `[...]`, `[!...]`,
    a `]` first in it literal), else None: an unclosed '[', or a ']' outside any class."""
    i, n = 0, len(pattern)
    while i < n:
        if pattern[i] == "]":
            return "a ']' with no '[' before it"
        if pattern[i] == "[":
            j = i + 1 + (pattern[i + 1:i + 2] == "!")
            j += pattern[j:j + 1] == "]"
            j = pattern.find("]", j)
            if j < 0:
                return "an unclosed '['"
            i = j
        i += 1
    return None


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Expectation:
    """`preset` gives `test` (at `seed`; None: every seed) the verdict `verdict`, because
    `reason`, while `until` (a requirement such as "onnxruntime<1.32"; "" always) holds.
    `line`: where it is written in the file."""

    preset: str
    test: str
    verdict: Verdict
    reason: str = ""
    seed: int | None = None
    until: str = ""
    line: int | None = None

    @property
    def key(self) -> tuple[str, str, int | None]:
        return self.preset, self.test, self.seed

    def names(self, preset: str, test_id: str, seed: int) -> bool:
        """Whether it names the result: a test id equal to `test` (whatever characters it
        holds) or matching it as a glob; the same for the preset."""
        return ((self.seed is None or self.seed == seed)
                and (preset == self.preset or fnmatch.fnmatchcase(preset, self.preset))
                and (test_id == self.test or fnmatch.fnmatchcase(test_id, self.test)))

    def specificity(self, preset: str, test_id: str) -> tuple[bool, bool, bool]:
        """How closely it names (preset, test_id): larger is more specific; the id or the
        name itself counts as exact whatever characters it holds."""
        return (self.test == test_id, self.preset == preset, self.seed is not None)

    def holds(self, version_of: Callable[[str], str | None] = installed_version) -> bool:
        """Whether `until` holds here: the package it names is installed at a version in
        its range (always, without `until`)."""
        if not self.until:
            return True
        from packaging.requirements import Requirement

        req = Requirement(self.until)
        version = version_of(req.name)
        return version is not None and req.specifier.contains(version, prereleases=True)


@dataclass
class _Index:
    """Where the entries are, by the test they name: a result is looked up among the entries
    of its own id and the glob ones, not against the whole file."""

    size: int
    by_test: dict[str, list[int]]          # a plain test id -> positions of its entries
    globs: list[int]                       # positions of the entries whose test is a glob


@dataclass
class Expectations:
    """The expectations of one file (`path`), in the order written. Lookups are indexed:
    whoever changes `entries` after a lookup calls `changed()`."""

    entries: list[Expectation] = field(default_factory=list)
    path: str = ""
    _index: _Index | None = field(default=None, init=False, repr=False, compare=False)
    _gone: set[int] = field(default_factory=set, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.entries)

    def changed(self) -> None:
        self._index = None

    def append(self, entry: Expectation) -> None:
        """Add an entry last, keeping the index (changing the test an entry names needs
        `changed()`; removing one, `forget`)."""
        index = self._index
        if index is not None and index.size == len(self.entries):
            (index.globs if is_glob(entry.test) else index.by_test.setdefault(entry.test, [])).append(index.size)
            index.size += 1
        else:
            self._index = None
        self.entries.append(entry)

    def forget(self, at: int) -> Expectation:
        """Stop finding the entry at `at`, leaving it in `entries` so that no later position
        moves and the index holds (taking it out would shift both); `kept()` leaves it out."""
        index = self._indexed()
        e = self.entries[at]
        (index.globs if is_glob(e.test) else index.by_test[e.test]).remove(at)
        self._gone.add(at)
        return e

    def kept(self) -> list[Expectation]:
        """The entries not forgotten, in order."""
        return [e for at, e in enumerate(self.entries) if at not in self._gone]

    def _indexed(self) -> _Index:
        if self._index is None or self._index.size != len(self.entries):
            by_test: dict[str, list[int]] = {}
            globs = []
            for at, e in enumerate(self.entries):
                if at in self._gone:
                    continue
                if is_glob(e.test):
                    globs.append(at)
                else:
                    by_test.setdefault(e.test, []).append(at)
            self._index = _Index(len(self.entries), by_test, globs)
        return self._index

    def match(self, preset: str, test_id: str, seed: int) -> Expectation | None:
        """The most specific expectation that names the result, expired or not (of equally
        specific ones, the first written)."""
        index = self._indexed()
        at = sorted(index.by_test.get(test_id, []) + index.globs)
        found = [e for e in (self.entries[i] for i in at) if e.names(preset, test_id, seed)]
        return max(found, key=lambda e: e.specificity(preset, test_id)) if found else None

    def about(self, presets: Iterable[str], tests: Iterable[str]) -> list[Expectation]:
        """The entries that name any of `presets` x `tests` (what a run of that selection
        may confirm or contradict)."""
        presets, tests = list(presets), list(tests)
        plain = set(tests)
        return [e for e in self.entries
                if any(fnmatch.fnmatchcase(p, e.preset) for p in presets)
                and (e.test in plain or (is_glob(e.test) and any(fnmatch.fnmatchcase(t, e.test) for t in tests)))]

    def position(self, key: tuple[str, str, int | None]) -> int | None:
        """Where the entry of exactly this (preset, test, seed) is, or None."""
        index = self._indexed()
        at = index.globs if is_glob(key[1]) else index.by_test.get(key[1], [])
        return next((i for i in at if self.entries[i].key == key), None)

