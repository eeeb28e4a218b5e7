"""`--update-expectations`: the file made to agree with a run, for what the run checked.

Per (preset, test) that ran (a skipped or unavailable result says nothing): a failure
already expected by an entry that holds stays as it is. Otherwise the test gets one exact
entry for every seed when all its seeds that ran failed alike (its per-seed entries for
those seeds are folded into it), else one per failing seed (an every-seed entry it had is
split into them); a reason already written is kept, and an expired `until` is dropped
from an entry rewritten. An exact entry whose results all pass now is removed. A glob
entry is never removed here: it may name presets and tests the run did not check, so one
that names only passing results is reported for removal by hand. Entries that name
nothing the run checked are never touched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..compare.results import Result
from ..core.safetext import printable
from ..core.verdicts import PASSING, Verdict
from .entries import Expectation, Expectations, installed_version, is_glob


@dataclass
class Changes:
    added: list[Expectation] = field(default_factory=list)
    changed: list[tuple[Expectation, Expectation]] = field(default_factory=list)   # (before, after)
    removed: list[Expectation] = field(default_factory=list)                      # it passes now
    replaced: list[Expectation] = field(default_factory=list)    # by entries per seed, or by one for all
    globs_passing: list[Expectation] = field(default_factory=list)   # to remove by hand, maybe

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.replaced)

    def lines(self) -> list[str]:
        """What changed, a line each, every preset and test written printable."""
        out = [f"+ {_named(e)} {e.verdict.value}" for e in self.added]
        out += [f"~ {_named(a)} {a.verdict.value} -> {b.verdict.value}"
                + (" (its expired `until` dropped)" if a.until and not b.until else "") for a, b in self.changed]
        out += [f"- {_named(e)} {e.verdict.value} (passes now)" for e in self.removed]
        out += [f"- {_named(e)} {e.verdict.value} (replaced, see the entries added)" for e in self.replaced]
        out += [f"? {_named(e)} {e.verdict.value} (a glob, line {e.line}): every result it names in "
                "this run passes; remove it by hand if it is fixed everywhere it names" for e in self.globs_passing]
        return out


def _named(e: Expectation) -> str:
    return f"{printable(e.preset)}: {printable(e.test)}" + (f" seed {e.seed}" if e.seed is not None else "")


def update(expectations: Expectations, results: Sequence[Result], failing: Iterable[Verdict],
           version_of: Callable[[str], str | None] = installed_version) -> tuple[Expectations, Changes]:
    """The expectations after the run `results` (every result of the selection), and what
    changed. `failing`: the verdicts that fail a run (the others are never expected)."""
    failing = frozenset(failing)
    entries = list(expectations.entries)
    current = Expectations(entries)        # the same list, looked up as it changes
    changes = Changes()
    by_test: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.verdict in failing or r.verdict in PASSING:
            by_test.setdefault((r.preset, r.test_id), []).append(r)

    def exact(preset: str, test: str, seed: int | None) -> int | None:
        return current.position((preset, test, seed))

    def holding(preset: str, test: str, seed: int) -> Expectation | None:
        e = current.match(preset, test, seed)
        return e if e is not None and e.holds(version_of) else None

    def pop(at: int) -> Expectation:
        return current.forget(at)

    def put(preset: str, test: str, seed: int | None, verdict: Verdict, reason: str) -> None:
        at = exact(preset, test, seed)
        if at is None:
            added = Expectation(preset, test, verdict, reason, seed)
            current.append(added)
            changes.added.append(added)
            return
        before = entries[at]
        after = dataclasses.replace(before, verdict=verdict, until=before.until if before.holds(version_of) else "")
        if after != before:
            changes.changed.append((before, after))
            entries[at] = after            # the same test: the index holds

    for (preset, test), runs in by_test.items():
        failed = [r for r in runs if r.verdict in failing]
        passed = [r for r in runs if r.verdict in PASSING]
        if all((e := holding(preset, test, r.seed)) is not None and e.verdict is r.verdict for r in failed) \
                and not any(holding(preset, test, r.seed) is not None for r in passed):
            continue                       # the file agrees with this test already
        if not failed:                     # it passes at every seed that ran: its exact entries go
            for seed in [None, *sorted({r.seed for r in passed})]:
                at = exact(preset, test, seed)
                if at is not None:
                    changes.removed.append(pop(at))
            continue
        every = exact(preset, test, None)
        reason = entries[every].reason if every is not None else ""
        if not passed and len({r.verdict for r in failed}) == 1:   # one verdict at every seed that ran
            for r in failed:               # its per-seed entries of those seeds fold into one
                at = exact(preset, test, r.seed)
                if at is not None:
                    reason = reason or entries[at].reason
                    changes.replaced.append(pop(at))
            put(preset, test, None, failed[0].verdict, reason)
            continue
        if every is not None:              # its seeds differ now: one entry each
            changes.replaced.append(pop(every))
        for r in failed:
            e = holding(preset, test, r.seed)
            if e is None or e.verdict is not r.verdict:
                put(preset, test, r.seed, r.verdict, reason or (e.reason if e is not None else ""))
        for r in passed:                   # an exact entry of a seed that passes now goes
            at = exact(preset, test, r.seed)
            if at is not None:
                changes.removed.append(pop(at))
    entries = current.kept()
    named: dict[Expectation, list[Result]] = {}
    for (preset, test), runs in by_test.items():
        for e in current.naming(test):
            if is_glob(e.preset + e.test) and e.names(preset, test, runs[0].seed):
                named.setdefault(e, []).extend(runs)
    changes.globs_passing = [e for e, runs in named.items() if all(r.verdict in PASSING for r in runs)]
    return Expectations(entries, expectations.path), changes

