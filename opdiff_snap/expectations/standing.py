"""A run's results against the expectations: which failures were expected, which are new,
which failed otherwise than expected, which passed where a failure was expected, and
which expectations have expired. The verdicts themselves are never changed; a result
carries the verdict expected of it (`Result.expected`) into the history.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..compare.results import Result
from ..core.verdicts import PASSING, Verdict
from .entries import Expectation, Expectations, installed_version


class Standing(str, enum.Enum):
    PASSED = "passed"                    # passed, and nothing else was expected
    EXPECTED = "expected"                # the verdict expected of it
    NEW = "new failure"                  # failed, and nothing (that holds) expected it
    DIFFERENT = "different failure"      # failed, but not as expected
    UNEXPECTED_PASS = "unexpected pass"  # passed where a failure was expected
    QUIET = "not judged"                 # not run here (skipped, unavailable), nothing expected of it

    def __str__(self) -> str:
        return self.value


@dataclass
class Judged:
    result: Result
    standing: Standing
    expectation: Expectation | None = None


@dataclass
class StandingReport:
    """Every result's standing, and the expectations that have expired."""

    judged: list[Judged] = field(default_factory=list)
    expired: list[Expectation] = field(default_factory=list)
    path: str = ""

    def of(self, standing: Standing) -> list[Judged]:
        return [j for j in self.judged if j.standing is standing]

    def fails(self, strict: bool = True) -> bool:
        """Whether the run fails: a new or different failure, or (strict) an unexpected pass."""
        return bool(self.of(Standing.NEW) or self.of(Standing.DIFFERENT)
                    or (strict and self.of(Standing.UNEXPECTED_PASS)))


class Expecter:
    """Applies `expectations` to results as they come (`__call__` sets `expected`), and
    judges a run's results at the end (`report`). `failing`: the verdicts that fail a run."""

    def __init__(self, expectations: Expectations, failing: Iterable[Verdict],
                 version_of: Callable[[str], str | None] = installed_version):
        self.expectations, self.failing = expectations, frozenset(failing)
        self._holds: dict[Expectation, bool] = {}
        self.version_of = version_of

    def holding(self, e: Expectation | None) -> Expectation | None:
        if e is None:
            return None
        if e not in self._holds:
            self._holds[e] = e.holds(self.version_of)
        return e if self._holds[e] else None

    def expected(self, preset: str, test_id: str, seed: int) -> Expectation | None:
        """The expectation that holds for this result, if any (its version range included)."""
        return self.holding(self.expectations.match(preset, test_id, seed))

    def __call__(self, result: Result) -> None:
        e = self.expected(result.preset, result.test_id, result.seed)
        result.expected = e.verdict if e is not None else None

    def standing(self, result: Result) -> Judged:
        e = self.expectations.match(result.preset, result.test_id, result.seed)
        held = self.holding(e)
        v = result.verdict
        if held is not None and v is held.verdict:
            return Judged(result, Standing.EXPECTED, held)
        if held is not None and v in PASSING:
            return Judged(result, Standing.UNEXPECTED_PASS, held)
        if v in self.failing:
            return Judged(result, Standing.DIFFERENT if held is not None else Standing.NEW, held or e)
        return Judged(result, Standing.PASSED if v in PASSING else Standing.QUIET, held)

    def report(self, results: Sequence[Result]) -> StandingReport:
        judged = [self.standing(r) for r in results]
        presets = {r.preset for r in results}
        tests = {r.test_id for r in results}
        expired = [e for e in self.expectations.about(presets, tests) if self.holding(e) is None]
        return StandingReport(judged, expired, self.expectations.path)
