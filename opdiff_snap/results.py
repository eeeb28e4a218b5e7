"""Results of a run: one (run, test, seed, preset) outcome each, and the helpers that
record and check share for turning outcomes into history lines."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from . import history
from .config import Settings
from .execution import Outcome, WorkerPool
from .suite import suite_paths
from .suite.model import TestCase, Tolerance
from .suite.selection import id_matches
from .verdicts import Verdict


@dataclass
class Result:
    """One (run, test, seed, preset) outcome."""

    test_id: str
    seed: int
    preset: str
    verdict: Verdict
    case: TestCase | None = None
    message: str = ""
    error_class: str | None = None
    export_ms: float | None = None
    load_ms: float | None = None
    infer_ms: float | None = None
    infer_ms_all: list[float] = field(default_factory=list)
    cache_hit: bool = False
    tolerance: Tolerance | None = None
    metrics: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.test_id, self.seed, self.preset)


@dataclass
class RunReport:
    run_id: str
    path: Path
    command: str
    results: list[Result]
    wall_s: float

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.verdict.value] = out.get(r.verdict.value, 0) + 1
        return out


Listener = Callable[[Result], None]


# ---------------------------------------------------------------- shared pieces

def resolve_suites(paths: Sequence[Path] | None, settings: Settings) -> list[Path]:
    return suite_paths(paths, settings.suites)


def seeds_for(case: TestCase, seeds: int | None, seed_list: Sequence[int] | None) -> tuple[int, ...]:
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


def make_pool(settings: Settings, in_process: bool) -> WorkerPool:
    return WorkerPool(jobs=settings.jobs, timeout_s=settings.timeout_s, in_process=in_process)


def with_timings(result: Result, outcome: Outcome) -> Result:
    result.export_ms, result.load_ms = outcome.export_ms, outcome.load_ms
    result.infer_ms, result.infer_ms_all = outcome.infer_ms, list(outcome.infer_ms_all)
    result.cache_hit = outcome.cache_hit
    result.error_class = outcome.error_class
    if outcome.error_message:
        result.message = outcome.error_message
    return result


def settings_json(settings: Settings, in_process: bool, cache: bool, pool: WorkerPool) -> dict[str, Any]:
    return {"jobs": settings.jobs, "repeats": settings.repeats, "warmup": settings.warmup,
            "timeout_s": settings.timeout_s, "in_process": in_process, "cache": cache,
            "threads": pool.threads}


def notice(listener: Listener | None, text: str) -> None:
    """Tell the user something before the results come (listeners with a `notice` method)."""
    say = getattr(listener, "notice", None)
    if callable(say):
        say(text)


def emit(writer: history.RunWriter, result: Result, baseline: str | None,
          results: list[Result], listener: Listener | None) -> None:
    writer.item(history.item_record(result, baseline=baseline))
    results.append(result)
    if listener:
        listener(result)


