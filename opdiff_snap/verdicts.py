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
| CRASH, TIMEOUT | the worker died (signal or exit code) / gave no answer in time | the pool |
| UNAVAILABLE | the preset cannot export or run on this machine, with why | execution |
| NO_GOLDEN, STALE, CORRUPT | no golden / its test changed / it fails verification | check's planning (CORRUPT also when an array fails at read time) |
| SKIPPED | a suite `skip:` or `--skips` entry, with its reason; in localize, an ATen node computed from weights and constants only (not run alone) | planning (record and check); localize |
| BASELINE_FAIL | record: the baseline could not produce a golden | record |
| RECORDED, KEPT | record: a golden written / an up-to-date one kept | record; the pytest fixture's recording run |
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
# The target ran and produced outputs that disagree with the golden.
COMPARISON = frozenset({V.MISMATCH, V.SHAPE_MISMATCH, V.DTYPE_MISMATCH, V.STRUCTURE_MISMATCH})
# A backend stage raised; its runtime often says why only on stderr, so the worker's
# output is quoted in the message.
STAGE_FAILURES = frozenset({V.EXPORT_FAIL, V.LOAD_FAIL, V.INFER_FAIL})
# The worker process itself failed.
WORKER_FAILURES = frozenset({V.CRASH, V.TIMEOUT})
# The target produced outputs (that then matched or not).
RAN = frozenset({V.PASS}) | COMPARISON
# Results a standalone repro script can reproduce.
REPRODUCIBLE = COMPARISON | STAGE_FAILURES | WORKER_FAILURES
# localize: a piece of a test run alone that does not mark where the divergence starts (it
# matched, or it was not run because it reads nothing but weights and constants).
NOT_DIVERGED = frozenset({V.PASS, V.SKIPPED})
# Decided from goldens and suites alone, before anything runs.
PLANNED = frozenset({V.NO_GOLDEN, V.STALE, V.CORRUPT, V.SKIPPED})
# Results whose message is not an error (the history keeps no error_message for them).
NO_ERROR = PASSING

# Worst first: how summaries order results, and which verdict wins when several apply.
PRECEDENCE: tuple[Verdict, ...] = (
    V.CRASH, V.TIMEOUT, V.CORRUPT, V.BASELINE_FAIL, V.EXPORT_FAIL, V.LOAD_FAIL, V.INFER_FAIL,
    V.STRUCTURE_MISMATCH, V.SHAPE_MISMATCH, V.DTYPE_MISMATCH, V.MISMATCH, V.STALE, V.NO_GOLDEN,
    V.UNAVAILABLE, V.SKIPPED, V.KEPT, V.RECORDED, V.PASS)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The verdict that comes first in PRECEDENCE (PASS for none)."""
    return min(verdicts, key=PRECEDENCE.index, default=V.PASS)

