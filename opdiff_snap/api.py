"""The public Python API. Each CLI command is one call of these, and nothing more.

    suites --load/select--> cases --worker: materialize, baseline--> Golden         (record)
    goldens --read--> Golden --worker: target--> Outcome --judge--> Result --> history (check)
    store/*.jsonl --DuckDB--> tables                                                  (query, reports)

Functions take a `settings` (config.Settings: where suites, goldens, store and cache are,
and the run settings); `warn` callbacks receive the history's warnings (lines skipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from .compare.results import Result, RunReport
from .core.config import Settings
from .core.verdicts import GoldenState, worst_state

if TYPE_CHECKING:  # the run modules import torch: each function imports what it runs
    from .run.upgrade import UpgradeReport

__all__ = ["Result", "RunReport", "add_references", "check", "compare_envs",
           "diff_page", "diff_runs", "gradcheck", "golden", "goldens", "html_report", "import_opinfo", "latency",
           "list_tests", "localize", "presets", "prune", "query", "record", "regressions", "repro", "runs", "schema",
           "site", "support", "upgrade", "validate", "verify", "write_diff_page"]

Warn = Callable[[str], None] | None


# ---------------------------------------------------------------- suites and presets

def presets() -> list:
    """(Preset, Availability) for every preset, built-in families first."""
    from .backends.registry import all_presets, availability

    return [(p, availability(p)) for p in all_presets()]


def list_tests(suites: Sequence[Path] | None = None, *, test_ids=None, tags=None,
               settings: Settings | None = None) -> list:
    """The expanded, selected test cases of the suites (default: every suite under settings.suites)."""
    from .core.errors import OpdiffError
    from .suite import load_suites, select, suite_paths

    settings = settings or Settings()
    paths = suite_paths(suites, settings.suites)
    if not paths:
        raise OpdiffError(f"no suites given and none under {settings.suites}.")
    return select(load_suites(paths), test_ids, tags)


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
          require_delegated: bool = False) -> RunReport:
    """Check the goldens on the `backends` presets; run.check.CheckRequest says what each
    option means."""
    from .run.check import CheckRequest
    from .run.check import check as check_run
    from .run.pipeline import Running, Selection

    running = Running(in_process=in_process, python=Path(python) if python is not None else None,
                      use_cache=use_cache)
    return check_run(CheckRequest(
        list(backends), Selection(suites, test_ids, tags, seeds, seed_list), running,
        preset_options=preset_options, skips=tuple(skips), tolerance=tolerance, resume=resume,
        trust_goldens=trust_goldens, shard=shard, run_group=run_group, require_delegated=require_delegated),
        settings=settings, argv=argv, listener=listener)


def add_references(suites: Sequence[Path] | None = None, **options: Any) -> list[Result]:
    """Give goldens recorded without a float64 reference one (run.record.add_references)."""
    from .run.record import add_references as run

    return run(suites, **options)


def upgrade(withs: Sequence[str], **options: Any) -> UpgradeReport:
    """Check the goldens with `withs` pinned and here, and diff the runs (run.upgrade.upgrade)."""
    from .run.upgrade import upgrade as run

    return run(withs, **options)


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
    """history.GroupSummary of each --run-group among `runs` (from runs()): its shards as one run."""
    from .history.runs import group_runs

    return group_runs(runs)


def _analytics(settings: Settings | None, warn: Warn):
    """The history of `settings.store`, its SQL under the settings' query limits."""
    from .analytics import Limits, connect

    settings = settings or Settings()
    a = connect(settings.store, warn=False, limits=Limits.of(settings))
    for w in a.warnings:
        if warn is not None:
            warn(w)
    return a


def query(sql: str, settings: Settings | None = None, warn: Warn = None):
    """Read-only, sandboxed SQL over the history (views `runs` and `results`) -> Table."""
    with _analytics(settings, warn) as a:
        return a.query(sql)


def schema(settings: Settings | None = None, warn: Warn = None) -> list:
    """(view, column, type, meaning) for every column of `runs` and `results`."""
    with _analytics(settings, warn) as a:
        return a.schema()


def support(settings: Settings | None = None, by: str | None = None, warn: Warn = None):
    """Tests x presets, the latest verdict of each (columns per library version with `by`)."""
    from .analytics.reports import support_matrix

    with _analytics(settings, warn) as a:
        return support_matrix(a, by=by)


def latency(settings: Settings | None = None, baseline: str | None = None, warn: Warn = None):
    """analytics.reports.LatencyReport: per preset, the latency ratio to the baseline and its trend."""
    from .analytics.reports import latency_report

    with _analytics(settings, warn) as a:
        return latency_report(a, baseline)


def diff_runs(a_run: str | None = None, b_run: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, settings: Settings | None = None, warn: Warn = None):
    """analytics.reports.RunDiff from run A to run B (or the latest runs on two versions of `by`)."""
    from .analytics.reports import diff_runs as compute

    with _analytics(settings, warn) as a:
        return compute(a, a_run, b_run, by=by, versions=versions, drift_factor=drift_factor,
                       latency_threshold=latency_threshold)


def regressions(flt=None, params=None, settings: Settings | None = None, warn: Warn = None):
    """Steps in latency, status changes and error growth over the whole history, each at the
    environment change it happened at: a list of analytics.findings.Finding (analytics/steps.py)."""
    from .analytics.steps import HistoryFilter, StepParams, detect

    with _analytics(settings, warn) as a:
        return detect(a, flt or HistoryFilter(), params or StepParams())


def compare_envs(python_b: Path, *, backends: Sequence[str], python_a: Path | None = None, selection=None,
                 preset_options=None, rounds: int = 3, min_ratio: float = 1.1, drift_factor: float = 10.0,
                 settings: Settings | None = None, argv: Sequence[str] = (), ui=None):
    """run.rounds.EnvComparison: the goldens checked under two interpreters in interleaved rounds."""
    from .run.rounds import compare_envs as run

    return run(python_b, backends=backends, python_a=python_a, selection=selection, preset_options=preset_options,
               rounds=rounds, min_ratio=min_ratio, drift_factor=drift_factor, settings=settings or Settings(),
               argv=argv, ui=ui)


def site(output: Path, flt=None, settings: Settings | None = None, warn: Warn = None) -> Path:
    """The history as a static folder of HTML (analytics/site.py); returns its index.html."""
    from .analytics.site import render_site
    from .analytics.steps import HistoryFilter

    with _analytics(settings, warn) as a:
        return render_site(a, output, flt or HistoryFilter())


def html_report(output: Path, settings: Settings | None = None) -> Path:
    """One self-contained HTML file over the history; returns its path."""
    from .analytics.html import render_html

    with _analytics(settings, None) as a:
        return render_html(a, output)


def diff_page(output: Path, a_run: str | None = None, b_run: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, settings: Settings | None = None, warn: Warn = None) -> Path:
    """diff_runs(A, B) (or the latest runs on two versions of `by`) as one self-contained HTML
    page with the latency ratio per op family; returns its path."""
    diff = diff_runs(a_run, b_run, by=by, versions=versions, drift_factor=drift_factor,
                     latency_threshold=latency_threshold, settings=settings, warn=warn)
    return write_diff_page(diff, output)


def write_diff_page(diff, output: Path) -> Path:
    """An analytics.reports.RunDiff (from diff_runs or upgrade) as one self-contained HTML page."""
    from .analytics.diff_html import render_diff_html

    return render_diff_html(diff, output)


# ---------------------------------------------------------------- goldens

@dataclass
class GoldenRow:
    """The goldens of one test, and what the suites say of them (goldens.model.golden_state):
    the worst state of its goldens."""

    test_id: str
    infos: list
    state: GoldenState


def _current(settings: Settings) -> dict[str, str] | None:
    """test id -> spec hash of every test in the project's suites (None: there are none)."""
    from .suite import load_suites, suite_paths

    paths = suite_paths(None, settings.suites)
    return {c.id: c.spec_hash for c in load_suites(paths, check_names=False)} if paths else None


def goldens(settings: Settings | None = None, test_ids=None) -> list[GoldenRow]:
    """Every golden grouped by test, with its state against the suites."""
    from .goldens import GoldenStore
    from .goldens.model import golden_state
    from .suite.selection import id_matches, parse_patterns

    settings = settings or Settings()
    current = _current(settings)
    grouped: dict[str, list] = {}
    for info in GoldenStore(settings.goldens).index():
        if test_ids and not id_matches(info.test_id, parse_patterns(test_ids)):
            continue
        grouped.setdefault(info.test_id, []).append(info)
    return [GoldenRow(tid, infos, worst_state([golden_state(i, current) for i in infos]))
            for tid, infos in grouped.items()]


def golden(test_id: str, seed: int = 0, settings: Settings | None = None):
    """One golden, every array checked (goldens.Golden)."""
    from .goldens import GoldenStore

    return GoldenStore((settings or Settings()).goldens).read(test_id, seed)


def prune(settings: Settings | None = None, delete: bool = False) -> list:
    """The goldens whose tests no longer exist in the suites (GoldenInfo); deleted with `delete`."""
    from .core.errors import OpdiffError
    from .goldens import GoldenStore
    from .goldens.model import golden_state

    settings = settings or Settings()
    current = _current(settings)
    if current is None:
        raise OpdiffError(f"no suites under {settings.suites}: refusing to prune, since every golden would "
                          "look orphaned. Pass --suites DIR.")
    store = GoldenStore(settings.goldens)
    orphans = [i for i in store.index() if golden_state(i, current) is GoldenState.ORPHAN]
    if delete:
        for info in orphans:
            store.delete_key(info.key)
    return orphans


def verify(settings: Settings | None = None) -> tuple[list, int]:
    """(findings, number of goldens): goldens.store.Finding for everything verification
    says (CORRUPT, STALE, UNCHECKED), as check would read them. No store, or a store without
    a golden (emptied, or the wrong location), is an OpdiffError: there is nothing to verify."""
    from .core.errors import OpdiffError
    from .goldens import GoldenStore

    where = (settings or Settings()).goldens
    store = GoldenStore(where)
    if not store.exists():
        raise OpdiffError(f"no golden store at {where}, so there is nothing to verify. If it should be "
                          "there, it was deleted or --goldens names another location; `opdiff record` "
                          "records the goldens again.")
    infos = store.index()
    if not infos:
        raise OpdiffError(f"the golden store {where} holds no goldens, so there is nothing to verify. If it "
                          "should hold some, they were deleted or --goldens names another location; "
                          "`opdiff record` records them again.")
    return store.findings(), len(infos)


def import_opinfo(out_dir: Path, *, ops: Sequence[str] = (), dtypes: Sequence[str] = ("float32",),
                  max_samples: int = 2, max_elements: int = 256, progress: Callable[[str], None] | None = None):
    """Write suites of torch's OpInfo samples into `out_dir` (importers/opinfo.py); an
    ImportReport says, per op, the samples kept and why the others were skipped."""
    from .importers.opinfo import import_opinfo as run_import

    return run_import(out_dir, ops=ops, dtypes=dtypes, max_samples=max_samples, max_elements=max_elements,
                      progress=progress)


def validate(suites=None, *, imports: bool = False, settings=None, in_process: bool = False,
             python: Path | None = None) -> list:
    """Load and validate suites (every problem at once, SuiteError). Paths are located
    without importing user code; those that parsing cannot settle (and, with `imports`,
    every path outside torch) are imported in workers (those of `settings.executor`, under
    `python` when given), and what fails there is reported the same way, naming the test
    and the path."""
    import json

    from .core.config import Settings
    from .core.errors import OpdiffError, Problem, SuiteError
    from .execution.probe import ImportProbe
    from .run.session import make_pool
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
        for path, module, config in case.code_paths():
            if path.startswith("torch.") and config is None:
                continue
            key = f"{path}\0{case.suite_dir}\0{module}\0{json.dumps(config, sort_keys=True)}"
            owners.setdefault(key, []).append(case)
            if key in probes:
                continue
            if not imports and config is None:   # a config's keys are known only to its class
                try:
                    if locate_path(path, case.suite_dir).kind is not Kind.UNKNOWN:
                        continue
                except NotFound:
                    continue   # load_suites has reported it
            probes[key] = ImportProbe(path, case.suite_dir, case.import_dirs, module, key=key, config=config)
    problems = []
    if probes:
        with make_pool(settings, in_process, python=python) as pool:
            for result in pool.run(list(probes.values())):
                if result.problem is not None:
                    case = owners[result.key][0]
                    path = probes[result.key].path
                    problems.append(Problem(str(case.suite), f"{path}: {result.problem}", test_id=case.id))
    if problems:
        raise SuiteError(problems)
    return cases


def golden_case(test_id: str, seed: int, goldens: Path | str = Path("goldens"), trust_goldens: bool = False,
                suites: Path | str = Path("suites")):
    """(TestCase, Golden) of one stored golden: the case rebuilt from the definition the
    golden was recorded from, so it always matches the stored inputs and weights (under
    the trust rules of goldens/cases.py: only the suites under `suites` may vouch for
    code the definition names)."""
    from .goldens import GoldenStore
    from .goldens.cases import GoldenCases
    from .suite import suite_paths

    golden = GoldenStore(goldens).read(test_id, seed)
    vouching = GoldenCases(trust_goldens, suite_paths(None, Path(suites)))
    case = vouching.case(test_id, seed, golden.definition, golden.suite)
    return case, golden


def localize(test_id: str, backend: str, *, seed: int = 0, preset_options=None,
             goldens: Path | str = Path("goldens"), ops: bool = False, tolerance=None, settings=None,
             in_process: bool = False, trust_goldens: bool = False, python: Path | None = None):
    """Where `test_id` first diverges on `backend`: the first leaf submodule, and below it
    (when no leaf diverges, or `ops`) the first ATen node or node range (see
    cause.localize). `tolerance` overrides the test's field by field, as check's does.
    Every step runs in the pool of `settings` (executor, jobs, timeout_s), its workers
    under `python` when given."""
    from .backends.registry import get_preset
    from .cause.localize import localize as find
    from .compare.tolerance import tolerance_for
    from .core.config import Settings
    from .core.errors import OpdiffError
    from .run.session import make_pool

    settings = settings or Settings()
    case, golden = golden_case(test_id, seed, goldens, trust_goldens, settings.suites)
    preset = get_preset(backend, preset_options)
    with make_pool(settings, in_process, python=python) as pool:
        report = find(case, golden.invocation, preset, lambda p: tolerance_for(case.tolerance, p, tolerance),
                      pool=pool, ops=ops, seed=seed,
                      baseline_precision=str(golden.baseline.get("precision") or "fp32"),
                      cache_dir=settings.cache)
    if report.error is not None:
        raise OpdiffError(f"test '{test_id}' on {backend}: {report.error}")
    if isinstance(preset_options, str):
        report.preset_options = preset_options
    return report


def repro(test_id: str, backend: str, out: Path, *, seed: int = 0, preset_options=None,
          goldens: Path | str = Path("goldens"), trust_goldens: bool = False, node: str | None = None,
          scope: str = "", timeout_s: float = 300.0, in_process: bool = False,
          suites: Path | str = Path("suites")) -> Path:
    """Write a standalone script reproducing `test_id` on `backend` (see cause.repro).
    `node` ("N" or "N-M", as localize names them): reproduce those ATen nodes of `scope`
    ("" for the module itself, "name" or "name#k" for a submodule call) instead, on the
    intermediate values the baseline computes for them; they are recorded in a worker."""
    from .backends.registry import get_preset
    from .cause.repro import parse_node_range, write_node_repro, write_repro
    from .compare.tolerance import tolerance_for
    from .core.errors import OpdiffError

    case, golden = golden_case(test_id, seed, goldens, trust_goldens, suites)
    preset = get_preset(backend, preset_options)
    tol = tolerance_for(case.tolerance, preset)
    if node is None:
        if scope:
            raise OpdiffError(f"--scope '{scope}' names a submodule whose ATen nodes to reproduce; give "
                              "--node too (as `opdiff localize` prints it).")
        return write_repro(case, golden, preset, out, tol, rounding=_rounding(case, golden, preset, timeout_s,
                                                                          in_process))
    if case.test_type != "module":
        raise OpdiffError(f"test '{test_id}' is a{'n op' if case.test_type == 'op' else ' pair'} test; --node "
                          "picks ATen nodes inside a module test (an op test's repro is already one op: "
                          "leave --node out).")
    from .cause.atengraph import ScopeGraphTask
    from .execution.pools import run_one

    parse_node_range(node)   # its syntax, before anything runs
    graph = run_one(ScopeGraphTask(case, golden.invocation, scope, bool(preset.options.get("export_strict"))),
                    timeout_s=timeout_s, in_process=in_process)
    if graph.error is not None:
        raise OpdiffError(f"test '{test_id}': {graph.error}")
    start, stop = parse_node_range(node, len(graph.nodes),
                                   f"scope '{scope or '<root>'}' of test '{test_id}'")
    return write_node_repro(case, graph, start, stop, preset, out, tol, seed)


def _rounding(case, golden, preset, timeout_s: float, in_process: bool):
    """What check judges `golden` with on `preset`: on fp16/bf16 with the elementwise
    reference too, computed in a worker."""
    from .execution.pools import run_one
    from .execution.references import REDUCED, ElementwiseTask
    from .run.judge import rounding_for

    if preset.precision not in REDUCED:
        return rounding_for(golden, preset)
    flat, structure = run_one(ElementwiseTask(case, golden.invocation, preset.precision),
                              timeout_s=timeout_s, in_process=in_process)
    return rounding_for(golden, preset, structure, flat)


def gradcheck(suites=None, *, test_ids=None, tags=None, seed: int = 0, eps: float = 1e-6,
              max_entries: int = 32, settings=None, in_process: bool = False, python: Path | None = None):
    """Autograd vs central finite differences in float64 for tests with `grad: true`
    (or every selected test when `test_ids` is given), in the pool of `settings`
    (executor, jobs, timeout_s), its workers under `python` when given."""
    from .core.config import Settings
    from .core.errors import OpdiffError
    from .execution.gradients import GradcheckTask
    from .run.session import make_pool
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
    with make_pool(settings, in_process, python=python) as pool:
        done = {r.test_id: r for r in pool.run(tasks)}
    return [done[c.id] for c in cases]



def ops(suites=None, *, backends: Sequence[str], test_ids=None, tags=None, seed: int = 0, settings=None,
        in_process: bool = False, python: Path | None = None):
    """Which presets lower each ATen op of the selected tests (see cause.lowering.OpsTask):
    (the op table, each test's survey). Answers come from the op-support cache of
    `settings.cache` where it has them; a test's ops are lowered alone only where its
    whole graph does not lower."""
    from .backends.registry import get_preset
    from .cause.lowering import OpsTask, op_table
    from .core.config import Settings
    from .core.errors import OpdiffError
    from .run.session import make_pool
    from .suite import load_suites, select, suite_paths

    settings = settings or Settings()
    presets = [get_preset(b) for b in backends]
    paths = suite_paths(suites, settings.suites)
    if not paths:
        raise OpdiffError(f"no suites given and none under {settings.suites}.")
    cases = select(load_suites(paths), test_ids, tags)
    if not cases:
        raise OpdiffError("no test selected: check the suites, --test-ids and --tags.")
    tasks = [OpsTask(c.id, c, presets, settings.cache, seed) for c in cases]
    with make_pool(settings, in_process, python=python) as pool:
        done = {t.test_id: t for t in pool.run(tasks)}
    surveyed = [done[c.id] for c in cases]
    return op_table(surveyed, [p.name for p in presets]), surveyed
