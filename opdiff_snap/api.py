"""The public Python API. Each CLI command is one call of these, and nothing more.

    suites --load/select--> cases --worker: materialize, baseline--> Golden         (record)
    goldens --read--> Golden --worker: target--> Outcome --judge--> Result --> history (check)
    store/*.jsonl --DuckDB--> tables                                                  (query, reports)

Functions take a `settings` (config.Settings: where suites, goldens, store and cache are,
and the run settings); `warn` callbacks receive the history's warnings (lines skipped).

Each command's body lives with its stage; most names here are that function itself,
imported on first use (`_STAGES`): the stages import torch or DuckDB, which a command
that only reads must not pay for.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .compare.results import Result, RunReport
from .core.config import Settings

if TYPE_CHECKING:
    from .analytics.commands import (
        diff_page,
        diff_runs,
        html_report,
        latency,
        query,
        regressions,
        schema,
        site,
        support,
        write_diff_page,
    )
    from .cause.coverage import coverage
    from .cause.gradcheck import gradcheck_tests as gradcheck
    from .cause.localize import localize_golden as localize
    from .cause.ops import survey_ops as ops
    from .cause.reproduce import reproduce as repro
    from .goldens.maintenance import GoldenRow, prune, verify
    from .goldens.maintenance import golden_rows as goldens
    from .goldens.model import Golden
    from .history.runs import group_runs as run_groups
    from .run.record import add_references
    from .run.upgrade import upgrade
    from .run.validate import validate
    from .suite import TestCase

__all__ = ["GoldenRow", "Result", "RunReport", "add_references", "check", "compare_envs", "coverage", "diff_page",
           "diff_runs", "gradcheck", "golden", "goldens", "html_report", "import_opinfo", "latency", "list_tests",
           "localize", "ops", "presets", "prune", "query", "reconcile_history", "record", "regressions", "repro",
           "run_groups", "runs", "schema", "site", "support", "upgrade", "validate", "verify", "write_diff_page"]

# name here -> (module, its name there)
_STAGES = {
    "validate": ("run.validate", "validate"),
    "GoldenRow": ("goldens.maintenance", "GoldenRow"), "goldens": ("goldens.maintenance", "golden_rows"),
    "prune": ("goldens.maintenance", "prune"), "verify": ("goldens.maintenance", "verify"),
    "add_references": ("run.record", "add_references"), "upgrade": ("run.upgrade", "upgrade"),
    "localize": ("cause.localize", "localize_golden"), "repro": ("cause.reproduce", "reproduce"),
    "gradcheck": ("cause.gradcheck", "gradcheck_tests"), "ops": ("cause.ops", "survey_ops"),
    "coverage": ("cause.coverage", "coverage"),
    "run_groups": ("history.runs", "group_runs"),
    **{name: ("analytics.commands", name) for name in ("query", "schema", "support", "latency", "diff_runs",
                                                      "regressions", "site", "html_report", "diff_page",
                                                      "write_diff_page")},
}


def __getattr__(name: str) -> Any:
    if name not in _STAGES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _STAGES[name]
    value = getattr(importlib.import_module(f".{module}", __package__), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_STAGES))


# ---------------------------------------------------------------- suites, presets, goldens

def import_opinfo(out_dir: Path, **options: Any):
    """Write suites from torch's OpInfo samples (importers/opinfo.py); a sample, or an input
    profile of one, whose golden would prove nothing (compare/vacuous.py) is left out."""
    from .compare.vacuous import vacuous_reason
    from .importers.opinfo import import_opinfo as write_suites

    return write_suites(out_dir, proves_nothing=vacuous_reason, **options)


def presets() -> list:
    """(Preset, Availability) for every preset, built-in families first."""
    from .backends.registry import all_presets, availability

    return [(p, availability(p)) for p in all_presets()]


def list_tests(suites: Sequence[Path] | None = None, *, test_ids=None, tags=None,
               settings: Settings | None = None) -> list[TestCase]:
    """The expanded, selected test cases of the suites (default: every suite under settings.suites)."""
    from .suite import select
    from .suite.given import given_cases

    return select(given_cases(suites, (settings or Settings()).suites), test_ids, tags)


def golden(test_id: str, seed: int = 0, settings: Settings | None = None) -> Golden:
    """One golden, every array checked."""
    from .goldens import GoldenStore

    return GoldenStore((settings or Settings()).goldens).read(test_id, seed)


# ---------------------------------------------------------------- record and check

def record(suites: Sequence[Path] | None = None, *, baseline: str = "torch_cpu_fp32",
           preset_options: str | dict | None = None, seeds: int | None = None,
           seed_list: Sequence[int] | None = None, test_ids: Sequence[str] | None = None,
           tags: Sequence[str] | None = None, force: bool = False,
           skips: Sequence[tuple[str, str]] = (), in_process: bool = False,
           settings: Settings = Settings(), argv: Sequence[str] = (),
           listener: Callable[[Result], None] | None = None, reference: bool = True) -> RunReport:
    """Record goldens on `baseline` for every selected (test, seed) that has none or a
    stale one (all of them with `force`); run/record.py says what each result means."""
    from .run.pipeline import Running, Selection
    from .run.record import RecordRequest
    from .run.record import record as record_run

    return record_run(RecordRequest(
        Selection(suites, test_ids, tags, seeds, seed_list), Running(in_process=in_process),
        baseline=baseline, preset_options=preset_options, force=force, skips=tuple(skips),
        reference=reference), settings=settings, argv=argv, listener=listener)


def check(suites: Sequence[Path] | None = None, *, backends: Sequence[str],
          preset_options: Mapping[str, str | dict] | None = None, seeds: int | None = None,
          seed_list: Sequence[int] | None = None, test_ids: Sequence[str] | None = None,
          tags: Sequence[str] | None = None, skips: Sequence[tuple[str, str]] = (),
          tolerance=None, resume: str | None = None, in_process: bool = False, use_cache: bool = True,
          trust_goldens: bool = False, settings: Settings = Settings(), argv: Sequence[str] = (),
          listener: Callable[[Result], None] | None = None, python: str | Path | None = None,
          shard: tuple[int, int] | None = None, run_group: str | None = None,
          require_delegated: bool = False, expectations=None) -> RunReport:
    """Check the goldens on the `backends` presets; run.check.CheckRequest says what each
    option means. `expectations`: an expectations.entries.Expectations (see
    `load_expectations`), whose expected verdicts the results carry."""
    from .run.check import CheckRequest
    from .run.check import check as check_run
    from .run.pipeline import Running, Selection

    running = Running(in_process=in_process, python=Path(python) if python is not None else None,
                      use_cache=use_cache)
    return check_run(CheckRequest(
        list(backends), Selection(suites, test_ids, tags, seeds, seed_list), running,
        preset_options=preset_options, skips=tuple(skips), tolerance=tolerance, resume=resume,
        trust_goldens=trust_goldens, shard=shard, run_group=run_group, require_delegated=require_delegated,
        expectations=expectations),
        settings=settings, argv=argv, listener=listener)


def load_expectations(path: Path | str | None = None, settings: Settings = Settings()):
    """The expectations file at `path` (default: the settings' `expectations`), validated
    against the preset names; None where the default file does not exist. Raises
    ExpectationsError with every problem of the file."""
    from .backends.registry import preset_names
    from .expectations.file import load

    if path is None:
        if not Path(settings.expectations).is_file():
            return None
        path = settings.expectations
    return load(path, preset_names())


def compare_envs(python_b: Path, *, backends: Sequence[str], python_a: Path | None = None, selection=None,
                 preset_options=None, rounds: int = 3, min_ratio: float = 1.1, drift_factor: float = 10.0,
                 settings: Settings | None = None, argv: Sequence[str] = (), ui=None):
    """run.rounds.EnvComparison: the goldens checked under two interpreters in interleaved rounds."""
    from .run.rounds import compare_envs as run

    return run(python_b, backends=backends, python_a=python_a, selection=selection, preset_options=preset_options,
               rounds=rounds, min_ratio=min_ratio, drift_factor=drift_factor, settings=settings or Settings(),
               argv=argv, ui=ui)


# ---------------------------------------------------------------- history

def runs(settings: Settings | None = None) -> list:
    """history.RunSummary of every run in the store, oldest first."""
    from .history.runs import list_runs

    return list_runs((settings or Settings()).store)


def reconcile_history(settings: Settings | None, how: str) -> str:
    """For a history store behind a URL that lacks runs this machine's mirror of it has (or
    has less of one): `how` = "restore" uploads the mirror's copies into the store, "accept"
    takes the store as it is and sets the mirror's copies aside. Says what was done."""
    from .storage import open_runs

    runs = open_runs((settings or Settings()).store)
    return runs.restore() if how == "restore" else runs.accept()
