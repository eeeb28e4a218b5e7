"""Check's plan: for every selected (test, seed), what can be said without running anything.

NO_GOLDEN (none recorded), BASELINE_FAIL (the baseline failed on the test at record),
STALE (spec hash changed, or the test is gone from the suites) and CORRUPT (unreadable
metadata or definition) are decided here, from the golden store's metadata; everything
else is planned to run (run/check_job.py). The planning reads the store's index and its
baseline failures once, then decides each item from them.

Without suites (no ./suites, none given) every golden is checked against the definition
stored in it; `--test-ids` and `--tags` select on that definition, and a `file:` module
that changed since record still makes the golden STALE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..core.safetext import printable
from ..core.verdicts import GoldenState, Verdict
from ..goldens import CorruptGolden, GoldenInfo, GoldenStore, key_of_unknown, store_key
from ..goldens.cases import GoldenCases, UntrustedGolden
from ..goldens.golden import golden_state
from ..goldens.ledger import BaselineFailure
from ..goldens.validate import definition_findings
from ..suite import select
from ..suite.model import TestCase
from ..suite.selection import seeds_for


@dataclass
class Planned:
    """One selected (test, seed). `verdict` is set when it is decided without running."""

    test_id: str
    seed: int
    case: TestCase | None
    info: GoldenInfo | None
    verdict: Verdict | None = None
    message: str = ""

    @property
    def baseline(self) -> str | None:
        return self.info.baseline if self.info is not None and self.info.baseline else None


@dataclass
class CheckPlan:
    items: list[Planned] = field(default_factory=list)


def _corrupt(test_id: str, seed: int, info: GoldenInfo | None, why: str) -> Planned:
    why = printable(why)   # read from the golden: shown escaped
    key = key_of_unknown(test_id)
    if key is not None:   # an entry whose test cannot be told (GoldenStore.index)
        return Planned(test_id, seed, None, info, Verdict.CORRUPT,
                       f"the entry {key} of the golden store is corrupt: {why}. It will not be "
                       "compared. Remove it, and re-record the test it held with `opdiff record`.")
    return Planned(test_id, seed, None, info, Verdict.CORRUPT,
                   f"the golden of test '{test_id}' seed {seed} is corrupt: {why}. It will not be "
                   f"compared. Re-record it with `opdiff record --test-ids '{test_id}' --force`.")


def _stale_message(info: GoldenInfo, case: TestCase) -> str:
    return ("the test or its file: module changed since the golden was recorded "
            f"(spec {info.spec_hash[:12]} -> {case.spec_hash[:12]}); re-record it with `opdiff record`")


def _failed_message(failed: BaselineFailure) -> str:
    reason = failed.reason.removeprefix(f"baseline {failed.baseline}: ").rstrip(". ")
    return (f"no golden: the baseline {failed.baseline} failed on this test when it was recorded "
            f"({failed.at[:19]}): {reason}. Fix the test (or give it a `skip:`), then run `opdiff record`")


def plan_item(case: TestCase, seed: int, info: GoldenInfo | None, failed: BaselineFailure | None = None,
              *, baseline: str | None = None) -> Planned:
    """One (test, seed) of a known test against its golden's metadata (`info`, None when
    there is none) and the baseline failure the store remembers for it. With `baseline`,
    a golden recorded on another baseline preset is STALE too (the pytest fixture's
    goldens follow the session's baseline)."""
    state = GoldenState.MISSING if info is None else golden_state(info, {case.id: case.spec_hash})
    if state is GoldenState.MISSING and failed is not None and failed.spec_hash == case.spec_hash:
        return Planned(case.id, seed, case, None, Verdict.BASELINE_FAIL, _failed_message(failed))
    if state is GoldenState.MISSING or info is None:
        return Planned(case.id, seed, case, None, Verdict.NO_GOLDEN, "no golden recorded; run `opdiff record`")
    if state is GoldenState.CORRUPT:
        item = _corrupt(case.id, seed, info, info.problem)
        item.case = case
        return item
    if state is GoldenState.STALE:
        return Planned(case.id, seed, case, info, state.verdict, _stale_message(info, case))
    if baseline is not None and info.baseline != baseline:
        return Planned(case.id, seed, case, info, Verdict.STALE,
                       f"the golden was recorded on {info.baseline}, the baseline is {baseline}; re-record it")
    return Planned(case.id, seed, case, info)


def plan_from_suites(cases: list[TestCase], store: GoldenStore, *, seeds: int | None = None,
                     seed_list: Sequence[int] | None = None, test_ids=None, tags=None,
                     report_orphans: bool = True) -> CheckPlan:
    """Selected cases x seeds against the store. With `report_orphans` (every suite of the
    project was loaded and nothing narrowed the selection), goldens of tests that no
    longer exist are STALE and unreadable ones CORRUPT."""
    selected = [(case, seeds_for(case, seeds, seed_list)) for case in select(cases, test_ids, tags)]
    orphans = report_orphans and not test_ids and not tags
    # a narrowed check reads the metadata of the goldens it selects, not of every golden
    wanted = None if orphans else {store_key(case.id, seed) for case, chosen in selected for seed in chosen}
    by_key = {info.key: info for info in store.index(only=wanted)}
    failures = store.baseline_failures()
    plan = CheckPlan()
    claimed: set[str] = set()
    for case, chosen in selected:
        for seed in chosen:
            key = store_key(case.id, seed)
            claimed.add(key)
            plan.items.append(plan_item(case, seed, by_key.get(key), failures.get(key)))
    if orphans:
        current = {c.id: c.spec_hash for c in cases}
        for key, info in sorted(by_key.items()):
            state = golden_state(info, current)
            if key in claimed or state not in (GoldenState.CORRUPT, GoldenState.ORPHAN):
                continue  # claimed, or a seed of a known test that was not asked for
            if state is GoldenState.CORRUPT:
                plan.items.append(_corrupt(info.test_id, info.seed, info, info.problem))
            else:
                plan.items.append(Planned(info.test_id, info.seed, None, info, state.verdict,
                                          "golden of a test that no longer exists in the suites; "
                                          "`opdiff goldens prune` removes it"))
    return plan


def plan_from_goldens(store: GoldenStore, *, seeds: int | None = None,
                      seed_list: Sequence[int] | None = None, test_ids=None, tags=None,
                      cases: GoldenCases | None = None) -> CheckPlan:
    """Every golden, each against the test definition stored in it, rebuilt under the
    trust rules of goldens/cases.py (raises UntrustedGolden naming every golden that
    would import code no suite vouches for)."""
    cases = cases if cases is not None else GoldenCases()
    wanted_seeds = set(seed_list) if seed_list else (set(range(seeds)) if seeds is not None else None)
    plan = CheckPlan()
    untrusted: list[tuple[str, int, list[str]]] = []
    for info in store.index():
        if wanted_seeds is not None and info.seed not in wanted_seeds:
            continue
        if info.problem:
            if not test_ids and not tags:  # its id and tags are unknown: only in an unnarrowed check
                plan.items.append(_corrupt(info.test_id, info.seed, info, info.problem))
            continue
        try:
            definition = store.read_definition(info.test_id, info.seed)
        except CorruptGolden as exc:
            plan.items.append(_corrupt(info.test_id, info.seed, info, exc.reason))
            continue
        found = definition_findings(info.test_id, definition, info.suite, info.spec_hash, info.test_type)
        if found.problems:  # a malformed stored definition, or one edited after record
            plan.items.append(_corrupt(info.test_id, info.seed, info, found.problems[0]))
            continue
        if not select([found.case], test_ids, tags):
            continue
        try:   # rebuilt from data, so only what the trust rules allow (goldens/cases.py)
            case = cases.case(info.test_id, info.seed, definition, info.suite)
        except UntrustedGolden as exc:
            untrusted.extend(exc.found)
            continue
        if case.spec_hash != info.spec_hash:
            plan.items.append(Planned(case.id, info.seed, case, info, Verdict.STALE, _stale_message(info, case)))
        else:
            plan.items.append(Planned(case.id, info.seed, case, info))
    if untrusted:
        raise UntrustedGolden(untrusted)
    return plan
