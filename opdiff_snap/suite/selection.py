"""opdiff test-id selection: `;`-separated items, each exact or a prefix ending in `*`."""

from __future__ import annotations

from typing import Iterable

from .model import TestCase


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


def select(cases: list[TestCase], patterns: list[str] | None = None,
           tags: list[str] | None = None) -> list[TestCase]:
    """Cases whose id matches any pattern item (all when none given) and that carry any
    of `tags` (all when none given); suite order is kept."""
    items = parse_patterns(patterns)
    wanted = {t for value in (tags or []) for t in value.split(",") if t.strip()} if tags else set()
    wanted = {t.strip() for t in wanted}
    return [c for c in cases
            if (not items or id_matches(c.id, items)) and (not wanted or wanted.intersection(c.tags))]
