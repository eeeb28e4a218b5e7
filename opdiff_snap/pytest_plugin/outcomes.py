"""Verdicts as pytest outcomes, and the text a failure shows.

| verdict | pytest outcome |
| --- | --- |
| PASS (RECORDED, KEPT) | passed |
| SKIPPED, UNAVAILABLE | skipped, with the reason |
| NO_GOLDEN, STALE, CORRUPT | failed, with the command that fixes it |
| comparison verdicts, stage failures, CRASH, TIMEOUT, BASELINE_FAIL | failed, with message and metrics |

The groups come from core/verdicts.py; nothing here decides a verdict.
"""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from ..compare.results import Result
from ..core.safetext import printable
from ..core.verdicts import PASSING, QUIET, Verdict

# metrics shown in a failure, in this order (the history has them all)
SHOWN_METRICS = ("max_abs", "max_rel", "mean_abs", "cosine", "mismatched", "numel", "worst_index",
                 "worst_output", "worst_expected", "worst_actual", "min_atol", "baseline_error",
                 "error_bound")


class VerdictFailed(AssertionError):
    """A check that did not pass; its text is the whole report."""


def _fmt(value: object) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _shown(metrics: dict[str, object]) -> list[str]:
    """`name=value` of the SHOWN_METRICS a result has, as the history writes them."""
    return [f"{k}={_fmt(metrics[k])}" for k in SHOWN_METRICS if metrics.get(k) is not None]


def describe(result: Result, fix: str | None = None, presets: Sequence[str] = ()) -> str:
    """`VERDICT on PRESET: message`, a line of metrics, and how to fix it. `presets`:
    every preset this same text stands for (default: the result's own). Ids and messages
    come from goldens: control characters in them are escaped."""
    on = ", ".join(presets) if presets else result.preset
    lines = [f"{result.verdict.value} on {on} (test '{result.test_id}' seed {result.seed})"
             + (f": {result.message}" if result.message else "")]
    metrics = result.metrics
    shown = _shown(metrics.to_json() if metrics is not None else {})
    if shown:
        lines.append("metrics: " + " ".join(shown))
    grad = metrics.grad if metrics is not None else None
    if grad is not None and grad.verdict != Verdict.PASS.value:
        lines.append("gradient metrics: " + " ".join(_shown(grad.to_json())))
    if result.tolerance is not None and result.verdict is not Verdict.PASS and shown:
        tol = result.tolerance
        lines.append(f"tolerance: atol={_fmt(tol.atol)} rtol={_fmt(tol.rtol)} "
                     f"baseline_factor={_fmt(tol.baseline_factor)} precision_factor={_fmt(tol.precision_factor)}")
    if fix:
        lines.append(f"fix: {fix}")
    return printable("\n".join(lines), lines=True)


def settle(results: Sequence[Result], fixes: dict[Verdict, str] | None = None, expected: Any = None,
           strict: bool = True) -> None:
    """Turn results into the test's outcome: return when every one passed (or nothing
    ran for a stated reason and at least one passed), skip when none ran, raise
    VerdictFailed naming every failing one (presets failing alike are named together).
    `expected`: the expectation (expectations.entries.Expectation) of a single result: its
    verdict as expected is an xfail with the reason; a pass is an unexpected pass, failed
    when `strict`."""
    __tracebackhide__ = True
    if expected is not None and len(results) == 1:
        r = results[0]
        why = f"{r.verdict.value} on {r.preset}, as expected" + (f": {expected.reason}" if expected.reason else "")
        if r.verdict is expected.verdict and r.verdict not in PASSING:
            pytest.xfail(printable(why))
        if r.verdict in PASSING and strict:
            raise VerdictFailed(printable(
                f"unexpected pass on {r.preset} (test '{r.test_id}' seed {r.seed}): {expected.verdict.value} was "
                f"expected (line {expected.line} of the expectations file"
                + (f": {expected.reason}" if expected.reason else "") + "). If it is fixed for good, remove the "
                f"entry, or run `opdiff check -b {r.preset} --update-expectations`."))
    fixes = fixes or {}
    failing = [r for r in results if r.verdict not in PASSING | QUIET]
    if failing:
        alike: dict[tuple, list[Result]] = {}
        for r in failing:
            alike.setdefault((r.verdict, r.message, repr(r.metrics)), []).append(r)
        raise VerdictFailed("\n\n".join(describe(group[0], fixes.get(group[0].verdict), [r.preset for r in group])
                                         for group in alike.values()))
    if results and all(r.verdict in QUIET for r in results):
        pytest.skip(printable("; ".join(f"{r.verdict.value} on {r.preset}: {r.message or 'no reason given'}"
                                        for r in results)))
