"""`opdiff ops`: which presets lower each ATen op of the selected tests, each test surveyed
in a worker (execution/op_survey.py): the op table, and the op calls whose answer changed
between the versions the op-support cache holds (`--changes`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..backends.base import Preset
from ..backends.registry import get_preset
from ..core.config import Settings
from ..core.errors import OpdiffError, error_text
from ..core.verdicts import Verdict
from ..execution.job import WorkerContext
from ..execution.op_support import OpSupportCache, OpVerdict
from ..execution.op_survey import TestGraph, answers_for
from ..execution.pools import make_pool
from ..suite import select
from ..suite.given import given_cases
from ..suite.model import TestCase


def survey_ops(suites=None, *, backends: Sequence[str], test_ids=None, tags=None, seed: int = 0,
               settings: Settings | None = None, in_process: bool = False,
               python: Path | None = None) -> tuple[list[OpRow], list[TestOps]]:
    """(the op table, each test's survey), the tests in suite order. Answers come from the
    op-support cache of `settings.cache` where it has them; a test's ops are lowered alone
    only where its whole graph does not lower."""
    settings = settings or Settings()
    presets = [get_preset(b) for b in backends]
    cases = select(given_cases(suites, settings.suites), test_ids, tags)
    if not cases:
        raise OpdiffError("no test selected: check the suites, --test-ids and --tags.")
    tasks = [OpsTask(c.id, c, presets, settings.cache, seed) for c in cases]
    with make_pool(settings, in_process, python=python) as pool:
        done = {t.test_id: t for t in pool.run(tasks)}
    surveyed = [done[c.id] for c in cases]
    return op_table(surveyed, [p.name for p in presets]), surveyed


@dataclass
class OpUse:
    """One distinct op call of a test and what each preset answered for it."""

    op: str
    signature: str
    count: int
    source: str
    lowers: dict[str, bool | None] = field(default_factory=dict)   # preset -> answer (None: not asked)
    stage: dict[str, str] = field(default_factory=dict)             # preset -> stage, where it does not


@dataclass
class TestOps:
    test_id: str
    uses: list[OpUse] = field(default_factory=list)
    asked: int = 0           # op calls lowered now (the rest: the cache, or the whole graph lowering)
    error: str | None = None


@dataclass
class OpsTask:
    """The ops of one test (its first seed's inputs) and which presets lower each, in a
    worker: from the op-support cache; for the rest, one lowering of the whole graph
    answers for all its ops when it succeeds, else each is lowered alone."""

    key: str
    case: TestCase
    presets: list[Preset]
    cache_dir: Any = None
    seed: int = 0

    def run(self, context: WorkerContext = WorkerContext()) -> TestOps:
        from ..backends.registry import backend_for
        from ..suite.materialize import materialize

        out = TestOps(self.case.id)
        try:
            test = TestGraph.of(self.case, materialize(self.case, self.seed), self.cache_dir, context.threads)
        except Exception as exc:
            out.error = str(exc) if isinstance(exc, OpdiffError) else error_text(exc)
            return out
        calls = test.calls
        out.uses = [OpUse(c.op, c.signature, len(c.nodes), c.nodes[0].source) for c in calls]
        for preset in self.presets:
            backend = backend_for(preset)
            avail = backend.availability(preset)
            if not avail.can_export:
                continue
            # one lowering of the whole graph answers for all its ops when it works
            whole = functools.partial(test.lowers_whole, backend, preset, avail.can_run)
            known, asked = answers_for(calls, preset, test.ask, test.cache, backend, whole)
            out.asked += asked
            for use, c in zip(out.uses, calls):
                v = known.get((c.op, c.signature))
                use.lowers[preset.name] = None if v is None else v.lowers
                if v is not None and not v.lowers:
                    use.stage[preset.name] = v.stage or ""
        return out

    def failed(self, status: Verdict, error_class: str | None, message: str) -> TestOps:
        return TestOps(self.case.id, error=f"{status.value}: {message}")


@dataclass
class OpRow:
    """One op across the surveyed tests: where it occurs and which presets lower it."""

    op: str
    tests: list[str] = field(default_factory=list)
    nodes: int = 0
    signatures: int = 0
    # preset -> "yes" (every call lowers), "no" (none does), "k/n" (k of n distinct calls)
    support: dict[str, str] = field(default_factory=dict)
    source: str = ""


def op_table(results: Sequence[TestOps], presets: Sequence[str]) -> list[OpRow]:
    """One row per op, those some preset cannot lower first, then by op name."""
    rows: dict[str, OpRow] = {}
    tally: dict[tuple[str, str], list[int]] = {}   # (op, preset) -> [lowering calls, answered calls]
    for t in results:
        for u in t.uses:
            row = rows.setdefault(u.op, OpRow(u.op, source=u.source))
            if t.test_id not in row.tests:
                row.tests.append(t.test_id)
            row.nodes += u.count
            row.signatures += 1
            for p in presets:
                answer = u.lowers.get(p)
                if answer is not None:
                    k = tally.setdefault((u.op, p), [0, 0])
                    k[0] += bool(answer)
                    k[1] += 1
    for row in rows.values():
        for p in presets:
            good, n = tally.get((row.op, p), [0, 0])
            row.support[p] = "-" if n == 0 else "yes" if good == n else "no" if good == 0 else f"{good}/{n}"
    return sorted(rows.values(), key=lambda r: (all(v in ("yes", "-") for v in r.support.values()), r.op))


@dataclass
class SupportChange:
    """An op call whose answer on a preset differs between two sets of versions in the cache."""

    preset: str
    op: str
    signature: str
    before: dict[str, str]
    after: dict[str, str]
    lowered_before: bool
    lowers_now: bool


def support_changes(cache: OpSupportCache, presets: Sequence[str] = ()) -> list[SupportChange]:
    """Op calls that became supported or unsupported between versions kept in the cache:
    for each (preset, op, signature), the newest answer against the one before it (by
    when it was asked)."""
    seen: dict[tuple[str, str, str], list[OpVerdict]] = {}
    for v in cache.entries():
        if not presets or v.preset in presets:
            seen.setdefault((v.preset, v.op, v.signature), []).append(v)
    out = []
    for (preset, op, sig), answers in sorted(seen.items()):
        by_versions: dict[str, OpVerdict] = {}
        for a in sorted(answers, key=lambda a: a.asked):
            by_versions[str(sorted(a.versions.items()))] = a
        ordered = sorted(by_versions.values(), key=lambda a: a.asked)
        if len(ordered) >= 2 and ordered[-2].lowers != ordered[-1].lowers:
            b, a = ordered[-2], ordered[-1]
            changed = {k: v for k, v in a.versions.items() if b.versions.get(k) != v}
            out.append(SupportChange(preset, op, sig, {k: b.versions.get(k, "absent") for k in changed}, changed,
                                     b.lowers, a.lowers))
    return out
