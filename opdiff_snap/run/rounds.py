"""Two environments checked in interleaved rounds (A, B, A, B, ...) and compared with a
confidence interval per latency (analytics/interleaved.py): what `upgrade --rounds N` runs
and `opdiff compare-envs` is.

Both sides run the same plan on the same goldens and store; only the interpreter the
workers run under differs (None: this one). Every round writes two runs into the history.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Protocol, Sequence

from ..analytics import Limits, connect
from ..analytics.interleaved import RoundsComparison, check_min_ratio, compare_rounds
from ..analytics.reports import RunDiff, diff_runs
from ..compare.results import Listener, RunReport
from ..core.config import Settings
from ..core.errors import OpdiffError
from ..execution.interpreter import probe, resolve
from .check import check
from .requests import CheckRequest


class RoundsUI(Protocol):
    def check(self, label: str) -> ContextManager[Listener | None]:
        """The listener for one check."""


class _Silent:
    def check(self, label: str) -> ContextManager[Listener | None]:
        return contextlib.nullcontext(None)


@dataclass
class EnvComparison:
    pairs: list[tuple[RunReport, RunReport]]    # (A, B) per round, in order
    comparison: RoundsComparison                # latency with its interval
    diff: RunDiff                               # the first round's diff, its latency from the rounds


def interleaved_checks(make_request: Callable[[Path | None], CheckRequest], python_a: Path | None,
                       python_b: Path | None, rounds: int, *, settings: Settings, argv: Sequence[str] = (),
                       ui: RoundsUI | None = None, labels: tuple[str, str] = ("A", "B")
                       ) -> list[tuple[RunReport, RunReport]]:
    """`rounds` x (check under python_a, then under python_b)."""
    if rounds < 1:
        raise OpdiffError(f"--rounds must be at least 1; got {rounds}.")
    for python in (python_a, python_b):   # both sides must be able to run before either writes a run
        if python is not None:
            probe(python)
    ui = ui or _Silent()
    pairs = []
    for i in range(rounds):
        runs = []
        for python, label in ((python_a, labels[0]), (python_b, labels[1])):
            with ui.check(f"round {i + 1}/{rounds}: {label}") as listener:
                runs.append(check(make_request(python), settings=settings, argv=list(argv), listener=listener))
        pairs.append((runs[0], runs[1]))
    return pairs


def compare_pairs(pairs: list[tuple[RunReport, RunReport]], settings: Settings, min_ratio: float = 1.1,
                  drift_factor: float = 10.0) -> EnvComparison:
    """The first round's diff (verdicts, drift, environment) with its latency changes taken
    from all rounds: only those whose 95 % interval clears min_ratio."""
    ids = [(a.run_id, b.run_id) for a, b in pairs]
    with connect(settings.store, limits=Limits.of(settings)) as past:
        diff = diff_runs(past, ids[0][0], ids[0][1], drift_factor=drift_factor)
        comparison = compare_rounds(past, ids, min_ratio)
    diff.latency = comparison.changes
    diff.ratios = comparison.all.select(["test_id", "seed", "preset", "median_a", "median_b", "ratio"])
    return EnvComparison(pairs, comparison, diff)


def compare_envs(python_b: Path, *, backends: Sequence[str], python_a: Path | None = None, suites=None,
                 selection=None, preset_options=None, rounds: int = 3, min_ratio: float = 1.1,
                 drift_factor: float = 10.0, settings: Settings = Settings(), argv: Sequence[str] = (),
                 ui: RoundsUI | None = None) -> EnvComparison:
    """Check the goldens under `python_a` (default: here) and `python_b` in interleaved rounds."""
    from .requests import Running, Selection

    if rounds < 2:
        raise OpdiffError(f"compare-envs needs --rounds of at least 2 for an interval; got {rounds}.")
    if not backends:
        raise OpdiffError("compare-envs needs at least one -b PRESET to check in both environments.")
    check_min_ratio(min_ratio)
    python_b = resolve(python_b)          # a wrong path fails here, before any run is written
    python_a = resolve(python_a) if python_a is not None else None
    chosen = selection or Selection(suites)

    def request(python: Path | None) -> CheckRequest:
        return CheckRequest(list(backends), chosen, Running(python=python), preset_options=preset_options)

    pairs = interleaved_checks(request, python_a, python_b, rounds, settings=settings, argv=argv, ui=ui,
                               labels=(f"A ({python_a or 'here'})", f"B ({python_b})"))
    return compare_pairs(pairs, settings, min_ratio, drift_factor)
