"""The public Python API: record(), check(), query(). Each CLI command calls one of these.

    suites --load/select--> cases --materialize--> Invocation --baseline--> Golden (record)
    goldens --read--> Golden --target--> Outcome --compare--> Result (check)
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from . import history
from .backends.base import Preset
from .backends.registry import availability, get_preset
from .compare import compare, tolerance_for
from .config import Settings
from .errors import OpdiffError
from .execution import Job, Outcome, WorkerPool, restore_outputs
from .goldens import CorruptGolden, Golden, GoldenInfo, GoldenStore
from .suite import case_from_definition, load_suites, materialize, select, suite_paths
from .suite.model import TestCase, Tolerance
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


def skip_reason(case: TestCase, preset_name: str) -> str | None:
    for pattern, reason in case.skip.items():
        if pattern == preset_name or fnmatch.fnmatchcase(preset_name, pattern):
            return reason or f"skipped for {pattern} by the suite"
    return None


def _pool(settings: Settings, in_process: bool) -> WorkerPool:
    return WorkerPool(jobs=settings.jobs, timeout_s=settings.timeout_s, in_process=in_process)


def _timed(result: Result, outcome: Outcome) -> Result:
    result.export_ms, result.load_ms = outcome.export_ms, outcome.load_ms
    result.infer_ms, result.infer_ms_all = outcome.infer_ms, list(outcome.infer_ms_all)
    result.cache_hit = outcome.cache_hit
    result.error_class = outcome.error_class
    if outcome.error_message:
        result.message = outcome.error_message
    return result


def _settings_json(settings: Settings, in_process: bool, cache: bool) -> dict[str, Any]:
    return {"jobs": settings.jobs, "repeats": settings.repeats, "warmup": settings.warmup,
            "timeout_s": settings.timeout_s, "in_process": in_process, "cache": cache}


def _emit(writer: history.RunWriter, result: Result, baseline: str | None,
          results: list[Result], listener: Listener | None) -> None:
    writer.item(history.item_record(result, baseline=baseline))
    results.append(result)
    if listener:
        listener(result)


# ---------------------------------------------------------------- record

def record(suites: Sequence[Path] | None = None, *, baseline: str = "torch_cpu_fp32",
           preset_options: str | dict | None = None, seeds: int | None = None,
           seed_list: Sequence[int] | None = None, test_ids: Sequence[str] | None = None,
           tags: Sequence[str] | None = None, force: bool = False, in_process: bool = False,
           settings: Settings = Settings(), argv: Sequence[str] = (),
           listener: Listener | None = None) -> RunReport:
    """Run the baseline on freshly materialised inputs and store goldens for every
    (test, seed) that has none or a stale one (or all of them with `force`)."""
    preset = get_preset(baseline, preset_options)
    avail = availability(preset)
    if not (avail.can_export and avail.can_run):
        raise OpdiffError(f"preset '{baseline}' cannot be the baseline on this machine: {avail.reason}. "
                          "Pick a preset that runs here (see `opdiff list-presets`).")
    suite_paths = resolve_suites(suites, settings)
    if not suite_paths:
        raise OpdiffError(f"no suites found under {settings.suites}. Give suite files, or create "
                          "suites there (see docs/yaml-format.md).")
    cases = select(load_suites(suite_paths), test_ids, tags)
    store = GoldenStore(settings.goldens)
    started = time.perf_counter()
    results: list[Result] = []
    pending: dict[str, tuple[TestCase, int]] = {}

    with history.RunWriter.start(settings.store, "record", list(argv), [str(p) for p in suite_paths],
                                 {preset.name: preset.to_json()}, _settings_json(settings, in_process, False),
                                 baseline_preset=preset.name) as writer:

        def jobs() -> Iterator[Job]:
            for case in cases:
                for seed in seeds_for(case, seeds, seed_list):
                    reason = skip_reason(case, preset.name)
                    if reason:
                        _emit(writer, Result(case.id, seed, preset.name, Verdict.SKIPPED, case, reason),
                              None, results, listener)
                        continue
                    info = store.info(case.id, seed)
                    if info is not None and info.spec_hash == case.spec_hash and not force:
                        _emit(writer, Result(case.id, seed, preset.name, Verdict.KEPT, case,
                                             "golden is up to date"), None, results, listener)
                        continue
                    try:
                        invocation = materialize(case, seed)
                    except OpdiffError as exc:
                        _emit(writer, Result(case.id, seed, preset.name, Verdict.BASELINE_FAIL, case,
                                             str(exc), error_class="MaterializeError"),
                              None, results, listener)
                        continue
                    key = f"{case.id}\0{seed}"
                    pending[key] = (case, seed)
                    yield Job(case=case, seed=seed, invocation=invocation, preset=preset,
                              repeats=settings.repeats, warmup=settings.warmup, cache_dir=None, key=key)

        invocations: dict[str, Any] = {}

        def remember(job_iter: Iterable[Job]) -> Iterator[Job]:
            for job in job_iter:
                invocations[job.key] = job.invocation
                yield job

        env = history.environment()
        with _pool(settings, in_process) as pool:
            for outcome in pool.run(remember(jobs())):
                case, seed = pending.pop(outcome.key)
                invocation = invocations.pop(outcome.key)
                result = _timed(Result(case.id, seed, preset.name, Verdict.RECORDED, case), outcome)
                if outcome.status is not None:
                    result.verdict = Verdict.BASELINE_FAIL
                    result.message = f"{outcome.status.value}: {outcome.error_message or ''}".strip()
                else:
                    outputs = restore_outputs(outcome.output_structure, outcome.outputs)
                    store.write(Golden(
                        test_id=case.id, seed=seed, spec_hash=case.spec_hash, suite=str(case.suite),
                        definition=dict(case.definition), test_type=case.test_type,
                        baseline={"name": preset.name, **preset.to_json()}, env=env,
                        created=history.utc_now(), invocation=invocation, outputs=outputs))
                _emit(writer, result, None, results, listener)
        wall = time.perf_counter() - started
        report = RunReport(writer.run_id, writer.path, "record", results, wall)
        writer.end(report.counts(), wall)
    return report


# ---------------------------------------------------------------- check

@dataclass
class _Planned:
    case: TestCase
    seed: int
    golden_info: GoldenInfo


def _plan_check(cases: list[TestCase] | None, store: GoldenStore, seeds: int | None,
                seed_list: Sequence[int] | None, test_ids, tags
                ) -> tuple[list[_Planned], list[tuple[str, int, Verdict, str, TestCase | None]]]:
    """What to run, and what is decided without running (NO_GOLDEN, STALE)."""
    index = {(g.test_id, g.seed): g for g in store.index()}
    planned: list[_Planned] = []
    decided: list[tuple[str, int, Verdict, str, TestCase | None]] = []
    if cases is None:  # no suites: check every golden against its own stored definition
        for (test_id, seed), info in sorted(index.items()):
            case = case_from_definition(test_id, store.read_definition(test_id, seed), Path(info.suite))
            planned.append(_Planned(case, seed, info))
        planned = [p for p in planned if p.case in select([p.case], test_ids, tags)]
        return planned, decided
    known_ids = {c.id for c in cases}
    for case in select(cases, test_ids, tags):
        wanted = seeds_for(case, seeds, seed_list)
        for seed in wanted:
            info = index.get((case.id, seed))
            if info is None:
                decided.append((case.id, seed, Verdict.NO_GOLDEN,
                                "no golden recorded; run `opdiff record`", case))
            elif info.spec_hash != case.spec_hash:
                decided.append((case.id, seed, Verdict.STALE,
                                "the test or its file: module changed since the golden was recorded "
                                f"(spec {info.spec_hash[:12]} -> {case.spec_hash[:12]}); re-record it", case))
            else:
                planned.append(_Planned(case, seed, info))
    if not test_ids and not tags:
        for (test_id, seed), info in sorted(index.items()):
            if test_id not in known_ids:
                decided.append((test_id, seed, Verdict.STALE,
                                "golden of a test that no longer exists in the suites; "
                                "`opdiff goldens prune` removes it", None))
    return planned, decided


def check(suites: Sequence[Path] | None = None, *, backends: Sequence[str],
          preset_options: dict[str, str | dict] | None = None, seeds: int | None = None,
          seed_list: Sequence[int] | None = None, test_ids: Sequence[str] | None = None,
          tags: Sequence[str] | None = None, tolerance: Tolerance | None = None,
          resume: str | None = None, in_process: bool = False, use_cache: bool = True,
          settings: Settings = Settings(), argv: Sequence[str] = (),
          listener: Listener | None = None) -> RunReport:
    """Run each target preset on exactly the stored inputs and weights and compare."""
    if not backends:
        raise OpdiffError("check needs at least one --backend PRESET (see `opdiff list-presets`).")
    options = preset_options or {}
    presets = [get_preset(name, options.get(name)) for name in backends]
    store = GoldenStore(settings.goldens)
    if not store.exists():
        raise OpdiffError(f"no golden store at {settings.goldens}. Run `opdiff record --baseline "
                          "torch_cpu_fp32` first, or point --goldens at an existing store.")
    suite_paths = resolve_suites(suites, settings)
    cases = load_suites(suite_paths) if suite_paths else None
    planned, decided = _plan_check(cases, store, seeds, seed_list, test_ids, tags)
    started = time.perf_counter()
    results: list[Result] = []

    if resume:
        writer, done = history.RunWriter.resume(settings.store, resume)
    else:
        writer = history.RunWriter.start(
            settings.store, "check", list(argv), [str(p) for p in suite_paths],
            {p.name: p.to_json() for p in presets}, _settings_json(settings, in_process, use_cache))
        done = set()
    baseline_of: dict[tuple[str, int], str] = {}

    with writer:
        for test_id, seed, verdict, message, case in decided:
            for preset in presets:
                if (test_id, seed, preset.name) not in done:
                    _emit(writer, Result(test_id, seed, preset.name, verdict, case, message),
                          None, results, listener)

        goldens: dict[str, Golden] = {}
        meta: dict[str, tuple[_Planned, Preset, Tolerance]] = {}

        def jobs() -> Iterator[Job]:
            for item in planned:
                case, seed = item.case, item.seed
                todo = [p for p in presets if (case.id, seed, p.name) not in done]
                if not todo:
                    continue
                try:
                    golden = store.read(case.id, seed)
                except CorruptGolden as exc:
                    for preset in todo:
                        _emit(writer, Result(case.id, seed, preset.name, Verdict.CORRUPT, case, str(exc)),
                              item.golden_info.baseline, results, listener)
                    continue
                baseline_of[(case.id, seed)] = item.golden_info.baseline
                for preset in todo:
                    reason = skip_reason(case, preset.name)
                    tol = tolerance_for(case.tolerance, preset, tolerance)
                    if reason:
                        _emit(writer, Result(case.id, seed, preset.name, Verdict.SKIPPED, case, reason,
                                             tolerance=tol), item.golden_info.baseline, results, listener)
                        continue
                    key = f"{case.id}\0{seed}\0{preset.name}"
                    goldens[key] = golden
                    meta[key] = (item, preset, tol)
                    yield Job(case=case, seed=seed, invocation=golden.invocation, preset=preset,
                              repeats=settings.repeats, warmup=settings.warmup,
                              cache_dir=settings.cache if use_cache else None, key=key)

        with _pool(settings, in_process) as pool:
            for outcome in pool.run(jobs()):
                golden = goldens.pop(outcome.key)
                item, preset, tol = meta.pop(outcome.key)
                case = item.case
                result = _timed(Result(case.id, item.seed, preset.name, Verdict.PASS, case,
                                       tolerance=tol), outcome)
                if outcome.status is not None:
                    result.verdict = outcome.status
                else:
                    actual = restore_outputs(outcome.output_structure, outcome.outputs)
                    if case.pair is not None:
                        cmp = compare(actual["a"], actual["b"], tol)
                    else:
                        cmp = compare(golden.outputs, actual, tol)
                    result.verdict = cmp.verdict
                    result.message = cmp.message
                    result.metrics = cmp.metrics.to_json() if cmp.metrics is not None else None
                _emit(writer, result, item.golden_info.baseline, results, listener)
        wall = time.perf_counter() - started
        report = RunReport(writer.run_id, writer.path, "check", results, wall)
        writer.end(report.counts(), wall)
    return report
