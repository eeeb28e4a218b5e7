"""`--update-expectations`: the file made to agree with a run, for what the run checked.

Every failure of the run becomes expected (an exact entry, per test, or per seed where its
seeds failed differently; the reason already written is kept); an exact entry whose
results all pass now is removed; a glob entry is removed only when every result it names
in the run passes. Entries that name nothing the run checked are never touched.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..compare.results import Result
from ..core.verdicts import PASSING, Verdict
from .entries import Expectation, Expectations, is_glob


@dataclass
class Changes:
    added: list[Expectation] = field(default_factory=list)
    changed: list[tuple[Expectation, Expectation]] = field(default_factory=list)   # (before, after)
    removed: list[Expectation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def lines(self) -> list[str]:
        out = [f"+ {e.preset}: {e.test}{_seed(e)} {e.verdict.value}" for e in self.added]
        out += [f"~ {a.preset}: {a.test}{_seed(a)} {a.verdict.value} -> {b.verdict.value}" for a, b in self.changed]
        out += [f"- {e.preset}: {e.test}{_seed(e)} {e.verdict.value} (passes now)" for e in self.removed]
        return out


def _seed(e: Expectation) -> str:
    return f" seed {e.seed}" if e.seed is not None else ""


def update(expectations: Expectations, results: Sequence[Result], failing: Iterable[Verdict]
           ) -> tuple[Expectations, Changes]:
    """The expectations after the run `results` (every result of the selection), and what
    changed. `failing`: the verdicts that fail a run (the others are never expected)."""
    failing = frozenset(failing)
    entries = list(expectations.entries)
    changes = Changes()
    by_test: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        by_test.setdefault((r.preset, r.test_id), []).append(r)

    def exact(preset: str, test: str, seed: int | None) -> int | None:
        return next((i for i, e in enumerate(entries) if e.key == (preset, test, seed)), None)

    for (preset, test), runs in by_test.items():
        failed = [r for r in runs if r.verdict in failing]
        passed = [r for r in runs if r.verdict in PASSING]
        verdicts = {r.verdict for r in failed}
        reason = ""
        if failed and not passed and len(verdicts) == 1:   # the test's one verdict, at every seed
            wanted: list[tuple[int | None, Verdict]] = [(None, failed[0].verdict)]
        else:
            wanted = [(r.seed, r.verdict) for r in failed]
            at = exact(preset, test, None)
            if at is not None and (passed or len(verdicts) > 1):   # its seeds differ now: one entry each
                reason = entries[at].reason
                changes.removed.append(entries.pop(at))
        for seed, verdict in wanted:
            run_seed = next(r.seed for r in runs if seed is None or r.seed == seed)
            current = Expectations(entries).match(preset, test, run_seed)
            if current is not None and current.verdict is verdict and (current.seed is None or seed is not None):
                continue                   # expected already (by this entry or a glob)
            at = exact(preset, test, seed)
            if at is not None:
                after = dataclasses.replace(entries[at], verdict=verdict)
                changes.changed.append((entries[at], after))
                entries[at] = after
            else:
                added = Expectation(preset, test, verdict, reason or (current.reason if current else ""), seed)
                entries.append(added)
                changes.added.append(added)
        for r in passed:                   # an exact entry of a seed that passes now goes
            at = exact(preset, test, r.seed)
            if at is not None:
                changes.removed.append(entries.pop(at))
        if passed and not failed:
            at = exact(preset, test, None)
            if at is not None:
                changes.removed.append(entries.pop(at))
    named: dict[Expectation, list[Result]] = {}
    for r in results:
        for e in entries:
            if is_glob(e.preset + e.test) and e.names(r.preset, r.test_id, r.seed):
                named.setdefault(e, []).append(r)
    for e, runs in named.items():   # a glob goes only when all it names in the run passes
        if all(r.verdict in PASSING for r in runs):
            entries.remove(e)
            changes.removed.append(e)
    return Expectations(entries, expectations.path), changes
