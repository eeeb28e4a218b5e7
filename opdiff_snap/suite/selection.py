"""What a run selects: tests by id (opdiff's `;`-separated items, each exact or a prefix
ending in `*`) and tag, seeds, and the (test, preset) pairs it skips (asked for, or an
edge profile on a preset of another precision)."""

from __future__ import annotations

import fnmatch
from typing import Iterable, Sequence

from .model import TestCase
from .profiles import floating_dtypes, precision_skip


def parse_patterns(patterns: Iterable[str] | None) -> list[str]:
    """Flag values (the flag may repeat) -> the individual items, blanks dropped."""
    return [p.strip() for value in (patterns or []) for p in value.split(";") if p.strip()]


def id_matches(test_id: str, items: list[str]) -> bool:
    for p in items:
        if p.endswith("*"):
            if test_id.startswith(p[:-1]):
                return True
        elif test_id == p:
            return True
    return False


def select(cases: list[TestCase], patterns: Sequence[str] | None = None,
           tags: Sequence[str] | None = None) -> list[TestCase]:
    """Cases whose id matches any pattern item (all when none given) and that carry any
    of `tags` (all when none given); suite order is kept."""
    items = parse_patterns(patterns)
    wanted = {t for value in (tags or []) for t in value.split(",") if t.strip()} if tags else set()
    wanted = {t.strip() for t in wanted}
    return [c for c in cases
            if (not items or id_matches(c.id, items)) and (not wanted or wanted.intersection(c.tags))]


def check_seeds(seeds: int | None, seed_list: Sequence[int] | None) -> None:
    """A run takes a seed count or an exact seed list, not both."""
    from ..core.errors import OpdiffError

    if seeds is not None and seed_list:
        raise OpdiffError("give either --seeds N or --seed-list, not both.")


def seeds_for(case: TestCase, seeds: int | None, seed_list: Sequence[int] | None) -> tuple[int, ...]:
    """The seeds to run: an exact list, else 0..seeds-1, else the test's own."""
    if seed_list:
        return tuple(seed_list)
    if seeds is not None:
        return tuple(range(seeds))
    return case.seeds


def skip_reason(case: TestCase | None, preset_name: str, skips: Sequence[tuple[str, str]] = (),
                test_id: str | None = None) -> str | None:
    """Why (case, preset) is not run: a suite `skip:` entry, or a requested (test id or
    prefix*, preset or glob) pair such as opdiff's `--skips id:preset`."""
    for pattern, reason in (case.skip.items() if case is not None else ()):
        if pattern == preset_name or fnmatch.fnmatchcase(preset_name, pattern):
            return reason or f"skipped for {pattern} by the suite"
    tid = case.id if case is not None else test_id
    for id_pattern, preset_pattern in skips:
        if tid is not None and id_matches(tid, [id_pattern]) and fnmatch.fnmatchcase(preset_name, preset_pattern):
            return f"skipped by --skips {id_pattern}:{preset_pattern}"
    return None


def profile_skip(case: TestCase | None, precision: str) -> str | None:
    """Why a test's edge profile is not judged on a preset computing in `precision`: its
    edge values belong to another precision (suite/profiles.py)."""
    if case is None:
        return None
    return precision_skip(case.id, case.profile, floating_dtypes([list(case.inputs), dict(case.kwargs)]), precision)
