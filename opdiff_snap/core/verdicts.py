"""The one vocabulary of outcomes, where each may be decided, and every grouping of them.

Nothing outside this module defines a set of verdicts: summaries, exit codes, JUnit,
history, plots and localize all use the groups below.

| verdict | meaning | decided by |
| --- | --- | --- |
| PASS | the target matches the golden (docs/check.md) | compare |
| MISMATCH | values differ beyond every rule | compare |
| SHAPE_MISMATCH, DTYPE_MISMATCH | an output has another shape / dtype | compare |
| STRUCTURE_MISMATCH | another nesting, or nothing to compare | compare; execution when the backend's outputs do not even fit the test's output structure, or the test returns no tensor or number |
| EXPORT_FAIL, LOAD_FAIL, INFER_FAIL | a backend stage raised (materialising and preparing count as export) | execution; the pool when a job cannot be sent to a worker |
| QUANTIZE_FAIL | an int8 preset's quantizer raised (preparing, calibrating or converting), before any export or lowering | execution |
| SQNR_LOW | an int8 result whose quantized reference is further from the golden than the minimum SQNR set for it (`min_sqnr`): the quantizer lost too much, whatever the backend did | check's judge |
| NOT_DELEGATED | it matched, but op nodes stayed off the delegate where every one must be on it (`--require-delegated`) | check's judge |
| CRASH, TIMEOUT | the worker died (signal or exit code) / gave no answer in time | the pool |
| UNAVAILABLE | the preset cannot export or run on this machine, with why | execution |
| NO_GOLDEN, STALE, CORRUPT | no golden / its test changed / it fails verification | check's planning (CORRUPT also when an array fails at read time) |
| SKIPPED | a suite `skip:` or `--skips` entry, with its reason; an edge profile on a preset of another precision (suite/profiles.py), with why; in localize, an ATen node computed from weights and constants only (not run alone) | planning (record and check); localize |
| BASELINE_FAIL | the baseline could not produce a golden | record; check's planning, for a test whose baseline failed when it was last recorded |
| RECORDED, KEPT | record: a golden written / an up-to-date one kept | record; the pytest fixture's recording run |

PRECEDENCE orders them worst first; every grouping is a set below. The history's SQL gets the
same from `TABLE` (analytics registers it as the `verdicts` table and macros), and the states
of a stored golden (`GoldenState`) are defined here too, each with the verdict check gives it.
"""

from __future__ import annotations

import enum
from typing import Iterable


class Verdict(str, enum.Enum):
    PASS = "PASS"
    MISMATCH = "MISMATCH"
    SHAPE_MISMATCH = "SHAPE_MISMATCH"
    DTYPE_MISMATCH = "DTYPE_MISMATCH"
    STRUCTURE_MISMATCH = "STRUCTURE_MISMATCH"
    EXPORT_FAIL = "EXPORT_FAIL"
    LOAD_FAIL = "LOAD_FAIL"
    INFER_FAIL = "INFER_FAIL"
    QUANTIZE_FAIL = "QUANTIZE_FAIL"
    SQNR_LOW = "SQNR_LOW"
    NOT_DELEGATED = "NOT_DELEGATED"
    CRASH = "CRASH"
    TIMEOUT = "TIMEOUT"
    UNAVAILABLE = "UNAVAILABLE"
    NO_GOLDEN = "NO_GOLDEN"
    STALE = "STALE"
    CORRUPT = "CORRUPT"
    SKIPPED = "SKIPPED"
    BASELINE_FAIL = "BASELINE_FAIL"
    RECORDED = "RECORDED"
    KEPT = "KEPT"

    def __str__(self) -> str:
        return self.value


V = Verdict

# The target ran and matched, or record did its job.
PASSING = frozenset({V.PASS, V.RECORDED, V.KEPT})
# Nothing ran, for a stated reason that is not a failure.
QUIET = frozenset({V.SKIPPED, V.UNAVAILABLE})
# What does not fail a run by default (`--fail-on` overrides).
NOT_FAILING = PASSING | QUIET
# The target was not run, and nothing in the result says it would fail: a skip, a preset
# this machine cannot run, no golden yet, a test changed since its golden. Such a result
# says nothing about the backend, so between two runs it is never newly failing or newly
# passing.
NOT_RUN = QUIET | {V.NO_GOLDEN, V.STALE}
# Something failed: the target, its worker, the baseline, or the golden itself (CORRUPT).
# Between two runs, PASSING in the first and FAILING in the second is newly failing; the
# reverse is newly passing.
FAILING = frozenset(Verdict) - PASSING - NOT_RUN
# The target ran and produced outputs that disagree with the golden.
COMPARISON = frozenset({V.MISMATCH, V.SHAPE_MISMATCH, V.DTYPE_MISMATCH, V.STRUCTURE_MISMATCH, V.SQNR_LOW})
# A backend stage raised; its runtime often says why only on stderr, so the worker's
# output is quoted in the message.
STAGE_FAILURES = frozenset({V.QUANTIZE_FAIL, V.EXPORT_FAIL, V.LOAD_FAIL, V.INFER_FAIL})
# The backend could not take the test (export, conversion, lowering, partitioning, loading):
# check and localize then lower each op of its graph alone to list every one it cannot take.
LOWERING_FAILURES = frozenset({V.EXPORT_FAIL, V.LOAD_FAIL})
# The worker process itself failed.
WORKER_FAILURES = frozenset({V.CRASH, V.TIMEOUT})
# The target produced outputs (that then matched or not).
RAN = frozenset({V.PASS}) | COMPARISON
# The backend took the test (exported, lowered and loaded it), whatever the outputs were.
LOWERED = RAN | {V.INFER_FAIL, V.NOT_DELEGATED}
# Results a standalone repro script can reproduce.
REPRODUCIBLE = (COMPARISON | STAGE_FAILURES | WORKER_FAILURES) - {V.QUANTIZE_FAIL, V.SQNR_LOW}
# localize: a piece of a test run alone that does not mark where the divergence starts (it
# matched, or it was not run because it reads nothing but weights and constants).
NOT_DIVERGED = frozenset({V.PASS, V.SKIPPED})
# localize where the preset converts but cannot run here (CoreML off macOS): a piece that
# converts is UNAVAILABLE only for want of a runtime, and so marks nothing either.
NOT_DIVERGED_CONVERTING = NOT_DIVERGED | {V.UNAVAILABLE}
# Decided from goldens and suites alone, before anything runs.
PLANNED = frozenset({V.NO_GOLDEN, V.STALE, V.CORRUPT, V.SKIPPED, V.BASELINE_FAIL})
# Results whose message is not an error (the history keeps no error_message for them).
NO_ERROR = PASSING

# Worst first: how summaries order results, which verdict wins when several apply (the
# support matrix's cell for several seeds), and `rank` in the SQL table (1 = worst).
PRECEDENCE: tuple[Verdict, ...] = (
    V.CRASH, V.TIMEOUT, V.CORRUPT, V.BASELINE_FAIL, V.QUANTIZE_FAIL, V.EXPORT_FAIL, V.LOAD_FAIL, V.INFER_FAIL,
    V.STRUCTURE_MISMATCH, V.SHAPE_MISMATCH, V.DTYPE_MISMATCH, V.MISMATCH, V.SQNR_LOW, V.NOT_DELEGATED, V.STALE, V.NO_GOLDEN,
    V.UNAVAILABLE, V.SKIPPED, V.KEPT, V.RECORDED, V.PASS)

# The kind of each verdict, one word per disjoint group.
KINDS: tuple[tuple[str, frozenset[Verdict]], ...] = (
    ("passing", PASSING), ("not_run", NOT_RUN), ("comparison", COMPARISON),
    ("stage", STAGE_FAILURES), ("worker", WORKER_FAILURES),
    ("golden", frozenset({V.CORRUPT})), ("baseline", frozenset({V.BASELINE_FAIL})),
    ("delegation", frozenset({V.NOT_DELEGATED})))


def kind(v: Verdict) -> str:
    return next(name for name, group in KINDS if v in group)


# One row per verdict, worst first: what the history's SQL knows of them (the `verdicts`
# table and the verdict_* macros, analytics/views.py).
TABLE_COLUMNS = ("status", "rank", "kind", "passing", "failing", "not_run")
TABLE: tuple[tuple[str, int, str, bool, bool, bool], ...] = tuple(
    (v.value, i, kind(v), v in PASSING, v in FAILING, v in NOT_RUN)
    for i, v in enumerate(PRECEDENCE, start=1))

# opdiff's own history files (readable beside ours) say OK for a stage that ran, and name
# their errors otherwise; none of that is a Verdict.
OPDIFF_OK = "OK"


class GoldenState(str, enum.Enum):
    """What the suites and verification say of one stored golden (`opdiff goldens ls` and
    `verify`), and the verdict check gives it (`verdict`; None: check compares it)."""

    CORRUPT = "CORRUPT"        # unreadable metadata, or verification fails
    ORPHAN = "ORPHAN"          # its test no longer exists in the suites
    STALE = "STALE"            # its test or a file: module changed since record
    MISSING = "missing"        # a selected test and seed without a golden
    UNCHECKED = "UNCHECKED"    # verify: its spec hash could not be checked from here
    UNKNOWN = "?"              # there are no suites to tell
    OK = "ok"

    def __str__(self) -> str:
        return self.value

    @property
    def verdict(self) -> Verdict | None:
        return _GOLDEN_VERDICTS.get(self)


_GOLDEN_VERDICTS = {GoldenState.CORRUPT: V.CORRUPT, GoldenState.ORPHAN: V.STALE,
                    GoldenState.STALE: V.STALE, GoldenState.MISSING: V.NO_GOLDEN}

# Worst first: the state of a test shown for all its goldens.
GOLDEN_PRECEDENCE: tuple[GoldenState, ...] = (
    GoldenState.CORRUPT, GoldenState.ORPHAN, GoldenState.STALE, GoldenState.MISSING,
    GoldenState.UNCHECKED, GoldenState.UNKNOWN, GoldenState.OK)


def worst_state(states: Iterable[GoldenState]) -> GoldenState:
    """The state that comes first in GOLDEN_PRECEDENCE (OK for none)."""
    return min(states, key=GOLDEN_PRECEDENCE.index, default=GoldenState.OK)
