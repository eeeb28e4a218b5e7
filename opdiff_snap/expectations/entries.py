"""Known results that are not PASS, as data: one expectation says that a preset (or a glob
of presets) gives a test (or a glob of tests), at one seed or every seed, a verdict, why,
and for which library versions that holds.

Matching picks, of the expectations that name a result, the most specific: the test's own
id before a glob, the preset's own name before a glob, one seed before every seed. An
expectation whose version range does not hold for this environment has expired: it
excuses nothing, and is reported as expired.
"""

from __future__ import annotations

import bisect
import fnmatch
import importlib.metadata
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..core.verdicts import Verdict

GLOB_CHARS = frozenset("*?[")
_GLOB_AT = re.compile(r"[*?\[]")


def is_glob(pattern: str) -> bool:
    return not GLOB_CHARS.isdisjoint(pattern)


def literal_prefix(pattern: str) -> str:
    """What every id a glob matches starts with: its characters before the first `*`, `?`
    or `[` (the whole of a plain id)."""
    m = _GLOB_AT.search(pattern)
    return pattern if m is None else pattern[:m.start()]


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
    of its own id and the glob ones whose literal prefix its id starts with, not against the
    whole file (so a lookup does not grow with the globs that cannot match it)."""

    size: int
    by_test: dict[str, list[int]] = field(default_factory=dict)   # a plain test id -> positions of its entries
    globs: dict[str, list[int]] = field(default_factory=dict)     # a glob's literal prefix -> positions
    lengths: set[int] = field(default_factory=set)                # of those prefixes

    def add(self, at: int, test: str) -> None:
        m = _GLOB_AT.search(test)
        if m is None:
            self.by_test.setdefault(test, []).append(at)
        else:
            self.globs.setdefault(test[:m.start()], []).append(at)
            self.lengths.add(m.start())

    def remove(self, at: int, test: str) -> None:
        (self.globs[literal_prefix(test)] if is_glob(test) else self.by_test[test]).remove(at)

    def candidates(self, test_id: str) -> list[int]:
        """The positions of the entries that may name `test_id`, in the order written."""
        at = list(self.by_test.get(test_id, ()))
        for n in self.lengths:
            if n <= len(test_id):
                at += self.globs.get(test_id[:n], ())
        return sorted(at)


@dataclass
class Expectations:
    """The expectations of one file (`path`), in the order written. Lookups are indexed:
    whoever changes `entries` after a lookup calls `changed()`."""

    entries: list[Expectation] = field(default_factory=list)
    path: str = ""
    digest: str = field(default="", compare=False)    # of the text read (file.digest), "" for none
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
            index.add(index.size, entry.test)
            index.size += 1
        else:
            self._index = None
        self.entries.append(entry)

    def forget(self, at: int) -> Expectation:
        """Stop finding the entry at `at`, leaving it in `entries` so that no later position
        moves and the index holds (taking it out would shift both); `kept()` leaves it out."""
        e = self.entries[at]
        self._indexed().remove(at, e.test)
        self._gone.add(at)
        return e

    def kept(self) -> list[Expectation]:
        """The entries not forgotten, in order."""
        return [e for at, e in enumerate(self.entries) if at not in self._gone]

    def _indexed(self) -> _Index:
        if self._index is None or self._index.size != len(self.entries):
            self._index = _Index(len(self.entries))
            for at, e in enumerate(self.entries):
                if at not in self._gone:
                    self._index.add(at, e.test)
        return self._index

    def naming(self, test_id: str) -> list[Expectation]:
        """The entries that name `test_id` (its own or a glob matching it), of any preset
        and seed, in the order written."""
        return [self.entries[i] for i in self._naming_at(test_id)]

    def _naming_at(self, test_id: str) -> list[int]:
        entries = self.entries
        return [i for i in self._indexed().candidates(test_id)
                if entries[i].test == test_id or fnmatch.fnmatchcase(test_id, entries[i].test)]

    def match(self, preset: str, test_id: str, seed: int) -> Expectation | None:
        """The most specific expectation that names the result, expired or not (of equally
        specific ones, the first written)."""
        found = [e for e in self.naming(test_id) if e.names(preset, test_id, seed)]
        return max(found, key=lambda e: e.specificity(preset, test_id)) if found else None

    def about(self, presets: Iterable[str], tests: Iterable[str]) -> list[Expectation]:
        """The entries that name any of `presets` x `tests` (what a run of that selection
        may confirm or contradict), in the order written."""
        presets = list(presets)
        named = sorted({i for t in dict.fromkeys(tests) for i in self._naming_at(t)})
        return [e for e in (self.entries[i] for i in named)
                if any(p == e.preset or fnmatch.fnmatchcase(p, e.preset) for p in presets)]

    def naming_no_test(self, test_ids: Iterable[str]) -> list[Expectation]:
        """The entries whose test is a glob that matches none of `test_ids` (each glob tried
        only against the ids that start with its literal prefix)."""
        ids = sorted(set(test_ids))
        out = []
        for e in self.entries:
            if not is_glob(e.test):
                continue
            prefix = literal_prefix(e.test)
            at = bisect.bisect_left(ids, prefix)
            while at < len(ids) and ids[at].startswith(prefix):
                if ids[at] == e.test or fnmatch.fnmatchcase(ids[at], e.test):
                    break
                at += 1
            else:
                out.append(e)
        return out

    def position(self, key: tuple[str, str, int | None]) -> int | None:
        """Where the entry of exactly this (preset, test, seed) is, or None."""
        index = self._indexed()
        at = index.globs.get(literal_prefix(key[1]), []) if is_glob(key[1]) else index.by_test.get(key[1], [])
        return next((i for i in at if self.entries[i].key == key), None)

