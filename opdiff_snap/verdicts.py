"""The one vocabulary of outcomes (DESIGN rule 3)."""

from __future__ import annotations

import enum


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
    # record only: the baseline ran and a golden was written / an up-to-date one was kept
    RECORDED = "RECORDED"
    KEPT = "KEPT"

    def __str__(self) -> str:
        return self.value


# Verdicts that do not fail a check by default (`--fail-on` overrides).
NOT_FAILING = frozenset({Verdict.PASS, Verdict.SKIPPED, Verdict.UNAVAILABLE,
                         Verdict.RECORDED, Verdict.KEPT})

# Comparison verdicts: the target ran and produced outputs that disagree.
COMPARE_FAILURES = frozenset({Verdict.MISMATCH, Verdict.SHAPE_MISMATCH, Verdict.DTYPE_MISMATCH,
                              Verdict.STRUCTURE_MISMATCH})
