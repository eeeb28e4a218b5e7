"""The public Python API. Each CLI command is one call of these, and nothing more.

    suites --load/select--> cases --worker: materialize, baseline--> Golden         (record)
    goldens --read--> Golden --worker: target--> Outcome --judge--> Result --> history (check)
    store/*.jsonl --DuckDB--> tables                                                  (query, reports)

Functions take a `settings` (config.Settings: where suites, goldens, store and cache are,
and the run settings); `warn` callbacks receive the history's warnings (lines skipped).

Each function is defined here and runs its stage, which it imports when called: the
stages import torch or DuckDB, which a command that only reads must not pay for. The
requests (`RecordRequest`, `CheckRequest`, `UpgradeRequest`) and what they hold
(`Selection`, `Running`) are torch-free and imported with this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .compare.results import Result, RunReport
from .core.config import Settings
from .run.requests import BundleRequest, CheckRequest, RecordRequest, Running, Selection, UpgradeRequest

if TYPE_CHECKING:
    from .goldens.golden import Golden
    from .suite import TestCase

Warn = Callable[[str], None] | None
Listener = Callable[[Result], None] | None

__all__ = ["BundleRequest", "CheckRequest", "RecordRequest", "Result", "RunReport", "Running", "Selection",
           "UpgradeRequest", "add_references", "bundle", "check", "compare_envs", "coverage", "diff_page",
           "diff_runs", "golden", "goldens", "gradcheck", "html_report", "import_opinfo", "latency", "list_tests",
           "load_expectations", "localize", "ops", "pack_goldens", "presets", "prune", "query", "reconcile_history",
           "record", "regressions", "repro", "run_groups", "runs", "schema", "site", "support", "upgrade",
           "validate", "verify", "write_diff_page"]


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


def validate(suites: Sequence[Path] | None = None, *, imports: bool = False, settings: Settings | None = None,
             in_process: bool = False, python: Path | None = None) -> list[TestCase]:
    """The suites validated (every problem -> SuiteError); with `imports`, what only an
    import settles is imported in workers too."""
    from .run.validate_suites import validate as run

    return run(suites, imports=imports, settings=settings, in_process=in_process, python=python)


def goldens(settings: Settings | None = None, test_ids: Sequence[str] | None = None) -> list:
    """goldens.maintenance.GoldenRow of every golden (or of `test_ids`): its state against the suites."""
    from .goldens.maintenance import golden_rows

    return golden_rows(settings, test_ids)


def prune(settings: Settings | None = None, delete: bool = False) -> list:
    """The goldens no suite defines any more (deleted with `delete`)."""
    from .goldens.maintenance import prune as run

    return run(settings, delete)


def pack_goldens(settings: Settings | None = None):
    """The store's small loose goldens folded into packs (goldens/repack.py): its PackReport."""
    from .goldens.maintenance import pack

    return pack(settings)


def verify(settings: Settings | None = None) -> tuple[list, int]:
    """Every golden read and checked: (findings, goldens read)."""
    from .goldens.maintenance import verify as run

    return run(settings)


def add_references(suites: Sequence[Path] | None = None, *, test_ids: Sequence[str] | None = None,
                   force: bool = False, in_process: bool = False, trust_goldens: bool = False,
                   settings: Settings = Settings(), listener: Listener = None) -> list[Result]:
    """The float64 reference added to stored goldens that lack one (all with `force`)."""
    from .run.record import add_references as run

    return run(suites, test_ids=test_ids, force=force, in_process=in_process, trust_goldens=trust_goldens,
               settings=settings, listener=listener)


# ---------------------------------------------------------------- record and check

def record(request: RecordRequest = RecordRequest(), *, settings: Settings = Settings(), argv: Sequence[str] = (),
           listener: Listener = None) -> RunReport:
    """Record goldens on the request's baseline for every selected (test, seed) that has
    none or a stale one (all of them with `force`); run/record.py says what each result means."""
    from .run.record import record as run

    return run(request, settings=settings, argv=argv, listener=listener)


def check(request: CheckRequest, *, settings: Settings = Settings(), argv: Sequence[str] = (),
          listener: Listener = None) -> RunReport:
    """Check the goldens on the request's presets; CheckRequest says what each option means.
    Its `expectations` (see `load_expectations`) set the verdict each result is expected to have."""
    from .run.check import check as run

    return run(request, settings=settings, argv=argv, listener=listener)


def bundle(request: BundleRequest, *, settings: Settings = Settings(), listener: Listener = None):
    """run.bundle.BundleReport: a replay bundle of the request's tests on its presets, for a
    device to run (docs/bundles.md); `check` with `outputs_from` judges what it returns."""
    from .run.bundle import bundle as run

    return run(request, settings=settings, listener=listener)


def upgrade(request: UpgradeRequest, *, settings: Settings = Settings(), argv: Sequence[str] = (), ui=None):
    """run.upgrade.UpgradeReport: the goldens checked here and in an environment with the
    request's packages replaced, and the diff."""
    from .run.upgrade import upgrade as run

    return run(request, settings=settings, argv=argv, ui=ui)


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
    return load(path, preset_names(), cache=_local_cache(settings))


def _local_cache(settings: Settings) -> Path | None:
    """The artifact cache's local folder, where derived data may be kept; None when unusable."""
    from .storage import StorageError, open_tiers

    try:
        return open_tiers(settings.cache).root
    except StorageError:
        return None


def compare_envs(python_b: Path, *, backends: Sequence[str], python_a: Path | None = None,
                 selection: Selection | None = None, preset_options=None, rounds: int = 3, min_ratio: float = 1.1,
                 drift_factor: float = 10.0, settings: Settings | None = None, argv: Sequence[str] = (), ui=None):
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


def run_groups(runs: list) -> list:
    """history.runs.GroupSummary of the runs: the shards of one run group taken together."""
    from .history.runs import group_runs

    return group_runs(runs)


# ---------------------------------------------------------------- why a test fails

def localize(test_id: str, backend: str, *, seed: int = 0, preset_options=None,
             goldens: Path | str = Path("goldens"), ops: bool = False, tolerance=None,
             settings: Settings | None = None, in_process: bool = False, trust_goldens: bool = False,
             python: Path | None = None):
    """cause.localize_report.LocalizeReport: where a module test first diverges on `backend`."""
    from .cause.localize import localize_golden

    return localize_golden(test_id, backend, seed=seed, preset_options=preset_options, goldens=goldens, ops=ops,
                           tolerance=tolerance, settings=settings, in_process=in_process,
                           trust_goldens=trust_goldens, python=python)


def repro(test_id: str, backend: str, out: Path, *, seed: int = 0, preset_options=None,
          goldens: Path | str = Path("goldens"), trust_goldens: bool = False, node: str | None = None,
          scope: str = "", timeout_s: float = 300.0, in_process: bool = False,
          suites: Path | str = Path("suites")) -> Path:
    """A standalone script (torch and the backend's runtime only) that reproduces a result."""
    from .cause.reproduce import reproduce

    return reproduce(test_id, backend, out, seed=seed, preset_options=preset_options, goldens=goldens,
                     trust_goldens=trust_goldens, node=node, scope=scope, timeout_s=timeout_s,
                     in_process=in_process, suites=suites)


def gradcheck(suites: Sequence[Path] | None = None, *, test_ids=None, tags=None, seed: int = 0, eps: float = 1e-6,
              max_entries: int = 32, settings: Settings | None = None, in_process: bool = False,
              python: Path | None = None) -> list:
    """cause.gradcheck reports: autograd against finite differences on the baseline."""
    from .cause.gradcheck import gradcheck_tests

    return gradcheck_tests(suites, test_ids=test_ids, tags=tags, seed=seed, eps=eps, max_entries=max_entries,
                           settings=settings, in_process=in_process, python=python)


def ops(suites: Sequence[Path] | None = None, *, backends: Sequence[str], test_ids=None, tags=None, seed: int = 0,
        settings: Settings | None = None, in_process: bool = False, python: Path | None = None):
    """(op rows, tests' ops): which presets lower each ATen op of the selected tests."""
    from .cause.ops import survey_ops

    return survey_ops(suites, backends=backends, test_ids=test_ids, tags=tags, seed=seed, settings=settings,
                      in_process=in_process, python=python)


def coverage(suites: Sequence[Path] | None = None, *, presets: Sequence[str] = (), test_ids=None, tags=None,
             seed: int = 0, settings: Settings | None = None, in_process: bool = False,
             python: Path | None = None, warn: Warn = None):
    """cause.coverage.Coverage: torch's Core ATen ops the tests exercise, per preset."""
    from .cause.coverage import coverage as run

    return run(suites, presets=presets, test_ids=test_ids, tags=tags, seed=seed, settings=settings,
               in_process=in_process, python=python, warn=warn)


# ---------------------------------------------------------------- analytics

def query(sql: str, settings: Settings | None = None, warn: Warn = None):
    """A read-only SQL statement over the history (analytics.Table)."""
    from .analytics.commands import query as run

    return run(sql, settings, warn)


def schema(settings: Settings | None = None, warn: Warn = None) -> list:
    """The history's tables and columns, each with its meaning."""
    from .analytics.commands import schema as run

    return run(settings, warn)


def support(settings: Settings | None = None, by: str | None = None, warn: Warn = None):
    """The support matrix: each test's latest verdict per preset (or per `by` library version)."""
    from .analytics.commands import support as run

    return run(settings, by, warn)


def latency(settings: Settings | None = None, baseline: str | None = None, warn: Warn = None):
    """Latency per preset, against `baseline`'s, and its trend."""
    from .analytics.commands import latency as run

    return run(settings, baseline, warn)


def diff_runs(a_run: str | None = None, b_run: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, settings: Settings | None = None, warn: Warn = None):
    """analytics.reports.RunDiff from run A to run B (or between two versions of `by`)."""
    from .analytics.commands import diff_runs as run

    return run(a_run, b_run, by=by, versions=versions, drift_factor=drift_factor,
               latency_threshold=latency_threshold, settings=settings, warn=warn)


def regressions(flt=None, params=None, settings: Settings | None = None, warn: Warn = None):
    """Latency steps, status changes and error growth over the history (analytics.findings)."""
    from .analytics.commands import regressions as run

    return run(flt, params, settings, warn)


def site(output: Path, flt=None, settings: Settings | None = None, warn: Warn = None) -> Path:
    """The static site of the history, written into `output`; its index page."""
    from .analytics.commands import site as run

    return run(output, flt, settings, warn)


def html_report(output: Path, settings: Settings | None = None) -> Path:
    """The one-page HTML report of the history."""
    from .analytics.commands import html_report as run

    return run(output, settings)


def diff_page(output: Path, a_run: str | None = None, b_run: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, settings: Settings | None = None, warn: Warn = None) -> Path:
    """Two runs compared as one HTML page."""
    from .analytics.commands import diff_page as run

    return run(output, a_run, b_run, by=by, versions=versions, drift_factor=drift_factor,
               latency_threshold=latency_threshold, settings=settings, warn=warn)


def write_diff_page(diff, output: Path) -> Path:
    """A RunDiff already made, written as one HTML page."""
    from .analytics.commands import write_diff_page as run

    return run(diff, output)
