"""`opdiff check`: goldens -> target preset -> compare -> verdicts in the history.

Plan first, then run. Planning (run/check_plan.py) decides, for every selected (test,
seed), what can be said without running anything: NO_GOLDEN, STALE, CORRUPT; a suite
`skip` matching the preset makes it SKIPPED. Everything else becomes one job per preset
(run/check_job.py), run in the worker pool on exactly the stored inputs and weights; an
array that fails its checksum at read time is CORRUPT too. Each outcome is judged
(run/judge.py), and each result written to the history as soon as it is known. A run
that was interrupted is resumed only with the same plan (run/plan_identity.py).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..backends.base import Preset
from ..backends.registry import backend_for, get_preset
from ..compare.results import Listener, Result, RunReport
from ..core.config import Settings, apply_endpoint
from ..core.errors import OpdiffError
from ..execution.batch import compile_ahead, rerun_alone
from ..execution.cache import cache_unusable
from ..execution.job import Outcome
from ..execution.pools import make_pool
from ..execution.runner import Job
from ..execution.warmup import warm_ups
from ..expectations.standing import Expecter
from ..goldens import GoldenStore
from ..goldens.cases import GoldenCases
from ..history.runs import ItemKey, RunFile, read_run
from ..history.writer import RunStart, RunWriter
from ..storage import StorageError, open_tiers
from ..suite import load_suites
from ..suite import suite_paths as find_suites
from ..suite.reader import SuiteReader
from ..suite.selection import check_seeds
from .check_job import item_work
from .check_plan import CheckPlan, plan_from_goldens, plan_from_suites
from .judge import Pending, judge
from .pipeline import Pipeline, Sinks
from .plan_identity import all_present, plan_identity, same_plan, shard_keys
from .replay import read_replay
from .requests import CheckRequest
from .session import notice, set_total, settings_json, warn


def check(request: CheckRequest, *, settings: Settings = Settings(), argv: Sequence[str] = (),
          listener: Listener | None = None) -> RunReport:
    """Run each target preset on exactly the stored inputs and weights and compare.

    A `listener` with a `set_total(n)` method is told how many results to expect.
    With `running.python`, the workers run under that interpreter (another environment's
    packages); planning, comparing and the history stay here, and the run's meta line
    records the workers' environment."""
    apply_endpoint(settings)
    replay = None
    if request.outputs_from is not None:
        replay = read_replay(request.outputs_from, request.backends)
        request = replay.request(request)
    sel, running = request.selection, request.running
    presets = preset_list(request, listener)
    use_cache = running.use_cache and cache_usable(settings, listener)
    store = golden_store(settings, listener)
    # one worker starts, and warms up the backends of presets that will export, while the
    # run is planned; the others once the plan says how many jobs there are
    pool = make_pool(settings, running.in_process, listener, running.python)
    try:
        warm = warm_ups(presets, settings.cache if use_cache else None) if replay is None else ()
        pool.prestart(warm, jobs=1)
        reader = suite_reader(settings, use_cache, listener)
        suite_paths, plan, golden_cases = plan_check(request, store, settings, listener, reader)
        if replay is not None:
            plan = dataclasses.replace(plan, items=[i for i in plan.items if replay.covers(i.test_id, i.seed)])
        # a worker interpreter that cannot serve, or a run that cannot resume, is refused before anything is written
        env = pool.environment() if replay is None else replay.environment()
        if pool.python is not None:
            notice(listener, f"workers run under {pool.python} (torch {env.get('torch')}, "
                   + ", ".join(f"{k} {env[k]}" for k in ("executorch", "onnxruntime", "coremltools")
                               if env.get(k)) + ")")
        run_settings = settings_json(settings, running.in_process, use_cache, pool)
        if replay is not None:
            run_settings.update(replay.settings())
        if not suite_paths and golden_cases.imported:
            run_settings["trusted_imports"] = list(golden_cases.imported)
        identity = plan_identity(plan, suite_paths, presets, sel, skips=request.skips, tolerance=request.tolerance,
                                 trust_goldens=request.trust_goldens, python=pool.python)
        writer, planned, done = _open_run(request, plan, presets, identity, settings, argv, suite_paths,
                                          run_settings, env, listener)
        prior = _prior_results(writer.path) if request.resume else []
        pool.prestart(warm, jobs=len(planned - done))
    except BaseException:
        pool.close()
        raise
    set_total(listener, len(planned) - len(done & planned))
    started = time.perf_counter()
    with writer:
        expecter = Expecter(request.expectations, ()) if request.expectations else None
        sinks = Sinks(listener, writer, expecter)
        stream: list | Iterator = _work(request, plan, presets, planned - done, store, settings, use_cache)
        if replay is not None:
            stream = (replay.work(*thing) if isinstance(thing, tuple) else thing for thing in stream)
        elif settings.batch > 1 and use_cache:
            stream = [(_alone_if_expected(thing[0], expecter), thing[1]) if isinstance(thing, tuple) else thing
                      for thing in stream]
            try:
                _compile_ahead(pool, [thing[0] for thing in stream if isinstance(thing, tuple)], settings, listener)
            except BaseException:
                pool.close()
                raise
        Pipeline(judge, sinks, again=_alone_unless_passed).drive(pool, stream)
        wall = time.perf_counter() - started
        all_present(writer, planned)
        writer.end(RunReport(writer.run_id, writer.path, "check", sinks.results, wall).counts(), wall)
    if sinks.annotate is not None:   # the results of the interrupted session are held to them too
        for result in prior:
            sinks.annotate(result)
    return RunReport(writer.run_id, writer.path, "check", prior + sinks.results, wall)


def preset_list(request: CheckRequest, listener: Listener | None) -> list[Preset]:
    """The request's presets, after what refuses the request before anything is read."""
    sel = request.selection
    check_seeds(sel.seeds, sel.seed_list)
    why = request.refusal()
    if why:
        raise OpdiffError(why)
    options = request.preset_options or {}
    presets = [get_preset(name, options.get(name)) for name in request.backends]
    if request.require_delegated:
        never = [p.name for p in presets if not backend_for(p).delegates(p)]
        if never:
            notice(listener, f"--require-delegated: {', '.join(never)} never hand{'s' if len(never) == 1 else ''} "
                   "a program to a delegate, so it holds nothing there; it holds the presets that delegate "
                   "(ExecuTorch on cpu, mps or coreml).")
    return presets


def golden_store(settings: Settings, listener: Listener | None) -> GoldenStore:
    store = GoldenStore(settings.goldens)
    if not store.exists():
        raise OpdiffError(f"no golden store at {settings.goldens}. Run `opdiff record --baseline "
                          "torch_cpu_fp32` first, or point --goldens at an existing store.")
    for problem in store.ledger_problems():
        warn(listener, f"the golden store's baseline failures: {problem} (`opdiff goldens verify` lists them)")
    return store


def _work(request: CheckRequest, plan: CheckPlan, presets: Sequence[Preset], todo: set[ItemKey],
          store: GoldenStore, settings: Settings, use_cache: bool) -> Iterator[Result | tuple[Job, Pending]]:
    """The check's work in plan order: for each planned item not yet done, the results
    decided without running and the jobs to run."""
    for item in plan.items:
        these = [p for p in presets if (item.test_id, item.seed, p.name) in todo]
        if these:
            decided, runs = item_work(item, these, store, skips=request.skips, tolerance=request.tolerance,
                                      settings=settings, use_cache=use_cache,
                                      require_delegated=request.require_delegated)
            yield from decided
            yield from runs


def _compile_ahead(pool: Any, jobs: Sequence[Job], settings: Settings, listener: Listener | None) -> None:
    """Compile the jobs' artifacts in batches first, where their presets can (execution/batch.py)."""
    def announce(batches: list) -> None:
        tests = sum(len(b.jobs) for b in batches)
        notice(listener, f"compiling {tests} of {len(jobs)} tests ahead, in {len(batches)} batches of up to "
                         f"{settings.batch} (--batch; 1 exports each test by itself)")

    done = compile_ahead(pool, jobs, settings.batch, announce)
    if done.batches:
        notice(listener, f"compiled {done.tests} of {len(jobs)} tests in {done.calls} exporter calls "
                         f"({done.export_ms / 1e3:.1f} s; --batch {settings.batch})")
    for why in done.lost:
        warn(listener, f"a batch could not be compiled ({why}); its tests are exported one by one")


def _alone_if_expected(job: Job, expecter: Expecter | None) -> Job:
    """A test the expectations say fails on its preset is exported alone from the start:
    its verdict would come from a run alone anyway, and in a batch it would cost the batch
    another exporter call (a failing piece) or itself a second run (a failing result)."""
    if expecter is None or job.alone or expecter.expected(job.preset.name, job.case.id, job.seed) is None:
        return job
    return dataclasses.replace(job, alone=True)


def _alone_unless_passed(job: Job, outcome: Outcome, result: Result) -> Job | None:
    """A test whose artifact a batch compiled and that did not PASS runs again alone: only
    that run's verdict counts."""
    if rerun_alone(job, outcome.batch, result.verdict):
        return dataclasses.replace(job, alone=True, batched=0)
    return None


def plan_check(request: CheckRequest, store: GoldenStore, settings: Settings, listener: Listener | None,
          reader: SuiteReader) -> tuple[list[Path], CheckPlan, GoldenCases]:
    """The check's plan: from the suites, or from the goldens alone when there are none."""
    sel = request.selection
    suite_paths = find_suites(sel.suites, settings.suites, reader)
    golden_cases = GoldenCases(trust=request.trust_goldens)   # used only when no suite is given
    if suite_paths:
        plan = plan_from_suites(load_suites(suite_paths, reader=reader), store, seeds=sel.seeds,
                                seed_list=sel.seed_list, test_ids=sel.test_ids, tags=sel.tags,
                                report_orphans=not sel.suites)
    else:
        plan = plan_from_goldens(store, seeds=sel.seeds, seed_list=sel.seed_list, test_ids=sel.test_ids,
                                 tags=sel.tags, cases=golden_cases)
        if golden_cases.imported:
            notice(listener, "--trust-goldens: the workers of this check import "
                   + ", ".join(golden_cases.imported) + ", as the goldens' definitions name them")
    if not plan.items and sel.narrowed:
        raise OpdiffError(f"no test matches --test-ids {list(sel.test_ids or [])} / --tags {list(sel.tags or [])}; "
                          "`opdiff list-tests` shows the ids. Nothing was checked.")
    if request.expectations and not sel.suites and not sel.narrowed:   # every test of the project is known
        from ..expectations.file import refuse_globs_naming_no_test

        among = f"of the suites in {settings.suites}" if suite_paths else f"of the goldens in {settings.goldens}"
        refuse_globs_naming_no_test(request.expectations, (i.test_id for i in plan.items), among)
    return suite_paths, plan, golden_cases


def _open_run(request: CheckRequest, plan: CheckPlan, presets: Sequence[Preset], identity: dict[str, Any],
              settings: Settings, argv: Sequence[str], suite_paths: Sequence[Path], run_settings: dict[str, Any],
              env: dict[str, Any], listener: Listener | None) -> tuple[RunWriter, set[ItemKey], set[ItemKey]]:
    """The run's history file (a new one, or the one `request.resume` names, when it planned
    exactly this), the (test, seed, preset) keys this run covers, and those it already holds."""
    shard = request.shard
    planned = {(i.test_id, i.seed, p.name) for i in plan.items for p in presets}
    if shard is not None:
        identity["shard"] = {"index": shard[0], "count": shard[1], "group": request.run_group}
    if request.resume:
        stored: dict[str, Any] = {}

        def accept(run: RunFile) -> None:
            same_plan(run, identity)
            stored.update((run.meta or {}).get("plan", {}).get("shard") or {})

        writer, done = RunWriter.resume(settings.store, request.resume, accept=accept)
        if shard is not None:
            planned = {(str(t), int(s), str(p)) for t, s, p in stored.get("keys") or []}
        return writer, planned, done
    if shard is not None:
        assert request.run_group is not None
        keys, split = shard_keys(plan, presets, shard, request.run_group, settings)
        planned = set(keys)
        identity["shard"]["keys"] = sorted([list(k) for k in planned])
        identity["shard"]["expected_ms"] = split.expected_ms
        notice(listener, split.describe(shard[0]))
    writer = RunWriter.start(settings.store, RunStart(
        "check", list(argv), [str(p) for p in suite_paths], {p.name: p.to_json() for p in presets}, run_settings,
        env=env, plan=identity, run_group=request.run_group, shard=f"{shard[0]}/{shard[1]}" if shard else None))
    return writer, planned, set()


def suite_reader(settings: Settings, use_cache: bool, listener: Listener | None = None) -> SuiteReader:
    """How a run reads its suites: each file once, and with the artifact cache in use,
    expansions kept in its local folder too (suite/expanded_cache.py; a tampered one is
    told to the listener)."""
    if not use_cache:
        return SuiteReader()
    try:
        return SuiteReader(open_tiers(settings.cache).root, lambda text: warn(listener, text))
    except StorageError:
        return SuiteReader()


def cache_usable(settings: Settings, listener: Listener | None) -> bool:
    """Whether the artifact cache can be used; when not, the listener is warned once and the
    check exports without it."""
    why = cache_unusable(settings.cache)
    if why:
        warn(listener, f"the artifact cache {settings.cache} cannot be written ({why}); this check exports "
                       "without it, as with --no-cache (its run records cache: false). Make it writable, "
                       "or pass --cache DIR.")
    return not why


def _prior_results(path: Path) -> list[Result]:
    """The items an interrupted run already holds (for the summary, JSON and JUnit)."""
    out = []
    for item in read_run(path).items:
        try:
            out.append(Result.from_json(item))
        except ValueError:
            continue
    return out
