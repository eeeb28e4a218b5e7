"""The public Python API. Each CLI command calls one of these.

    suites --load/select--> cases --materialize--> Invocation --baseline--> Golden   (record)
    goldens --read--> Golden --target--> Outcome --compare--> Result --> history     (check)
    store/*.jsonl --DuckDB--> tables                                                 (query)
"""

from __future__ import annotations

from pathlib import Path

from .checking import check
from .recording import record
from .results import Result, RunReport
from .upgrading import UpgradeReport, UpgradeUI, upgrade

__all__ = ["Result", "RunReport", "UpgradeReport", "UpgradeUI", "check", "diff_page", "query", "record",
           "upgrade"]


def query(sql: str, store: Path = Path("store")):
    """Read-only SQL over the run history; returns an analytics Table (columns, rows)."""
    from .analytics import connect

    with connect(store, warn=False) as a:
        return a.query(sql)


def validate(suites=None, *, imports: bool = False, settings=None, in_process: bool = False) -> list:
    """Load and validate suites (every problem at once, SuiteError). Paths are located
    without importing user code; those that parsing cannot settle (and, with `imports`,
    every path outside torch) are imported in workers, and what fails there is reported
    the same way, naming the test and the path."""
    from .config import Settings
    from .errors import OpdiffError, Problem, SuiteError
    from .execution import WorkerPool
    from .execution.probe import ImportProbe
    from .suite import load_suites, suite_paths
    from .suite.locate import Kind, NotFound, locate_path

    settings = settings or Settings()
    paths = suite_paths(suites, settings.suites)
    if not paths:
        raise OpdiffError(f"no suites given and none under {settings.suites}.")
    cases = load_suites(paths)
    probes: dict[str, ImportProbe] = {}
    owners: dict[str, list] = {}
    for case in cases:
        for path, module in case.code_paths():
            if path.startswith("torch."):
                continue
            key = f"{path}\0{case.suite_dir}\0{module}"
            owners.setdefault(key, []).append(case)
            if key in probes:
                continue
            if not imports:
                try:
                    if locate_path(path, case.suite_dir).kind is not Kind.UNKNOWN:
                        continue
                except NotFound:
                    continue   # load_suites has reported it
            probes[key] = ImportProbe(path, case.suite_dir, case.import_dirs, module, key=key)
    problems = []
    if probes:
        with WorkerPool(jobs=settings.jobs, timeout_s=settings.timeout_s, in_process=in_process) as pool:
            for result in pool.run(list(probes.values())):
                if result.problem is not None:
                    case = owners[result.key][0]
                    path = probes[result.key].path
                    problems.append(Problem(str(case.suite), f"{path}: {result.problem}", test_id=case.id))
    if problems:
        raise SuiteError(problems)
    return cases


def golden_case(test_id: str, seed: int, goldens: Path = Path("goldens"), trust_goldens: bool = False):
    """(TestCase, Golden) of one stored golden: the case rebuilt from the definition the
    golden was recorded from, so it always matches the stored inputs and weights (under
    the trust rules of goldens/cases.py)."""
    from .goldens import GoldenStore
    from .goldens.cases import GoldenCases

    golden = GoldenStore(goldens).read(test_id, seed)
    case = GoldenCases(trust_goldens).case(test_id, seed, golden.definition, golden.suite)
    return case, golden


def localize(test_id: str, backend: str, *, seed: int = 0, preset_options=None,
             goldens: Path = Path("goldens"), timeout_s: float = 600.0, in_process: bool = False,
             trust_goldens: bool = False):
    """First leaf submodule whose output leaves tolerance on `backend` (see cause.localize),
    found in a worker process."""
    from .backends.registry import get_preset
    from .cause.localize import LocalizeTask
    from .errors import OpdiffError
    from .execution.pool import run_one

    case, golden = golden_case(test_id, seed, goldens, trust_goldens)
    if case.test_type != "module":
        raise OpdiffError(f"test '{test_id}' is a{'n op' if case.test_type == 'op' else ' pair'} test; "
                          "localize needs a module test (it hooks the module's submodules).")
    report = run_one(LocalizeTask(case, golden.invocation, get_preset(backend, preset_options)),
                     timeout_s=timeout_s, in_process=in_process)
    if report.error is not None:
        raise OpdiffError(f"test '{test_id}' on {backend}: {report.error}")
    return report


def repro(test_id: str, backend: str, out: Path, *, seed: int = 0, preset_options=None,
          goldens: Path = Path("goldens"), trust_goldens: bool = False) -> Path:
    """Write a standalone script reproducing `test_id` on `backend` (see cause.repro)."""
    from .backends.registry import get_preset
    from .cause.repro import write_repro
    from .compare import tolerance_for

    case, golden = golden_case(test_id, seed, goldens, trust_goldens)
    preset = get_preset(backend, preset_options)
    return write_repro(case, golden, preset, out, tolerance_for(case.tolerance, preset))


def gradcheck(suites=None, *, test_ids=None, tags=None, seed: int = 0, eps: float = 1e-6,
              max_entries: int = 32, settings=None, in_process: bool = False):
    """Autograd vs central finite differences in float64 for tests with `grad: true`
    (or every selected test when `test_ids` is given)."""
    from .config import Settings
    from .execution import WorkerPool
    from .execution.gradients import GradcheckTask
    from .errors import OpdiffError
    from .suite import load_suites, select, suite_paths

    settings = settings or Settings()
    paths = suite_paths(suites, settings.suites)
    if not paths:
        raise OpdiffError(f"no suites given and none under {settings.suites}.")
    cases = select(load_suites(paths), test_ids, tags)
    if not test_ids:
        cases = [c for c in cases if c.grad]
    if not cases:
        raise OpdiffError("no test to gradcheck: mark tests with `grad: true` or select them with --test-ids.")
    tasks = [GradcheckTask(c, seed, eps, max_entries, key=c.id) for c in cases]
    with WorkerPool(jobs=settings.jobs, timeout_s=settings.timeout_s, in_process=in_process) as pool:
        done = {r.test_id: r for r in pool.run(tasks)}
    return [done[c.id] for c in cases]


def diff_page(out: Path, run_a: str | None = None, run_b: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, store: Path = Path("store"),
              drift_factor: float = 10.0, latency_threshold: float = 0.25) -> Path:
    """Runs A and B (or the latest check runs on two versions of library `by`) compared on one
    self-contained HTML page, with the latency ratio per op family."""
    from .analytics.diff_html import render_diff_html
    from .analytics.reports import diff_runs

    diff = diff_runs(store, run_a, run_b, by=by, versions=versions, drift_factor=drift_factor,
                     latency_threshold=latency_threshold)
    return render_diff_html(diff, out)
