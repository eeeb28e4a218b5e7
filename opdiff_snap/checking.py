"""`opdiff check`: goldens -> target preset -> compare -> verdicts in the history."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from . import history
from .backends.base import Preset
from .backends.registry import get_preset
from .compare import compare, tolerance_for
from .config import Settings
from .errors import OpdiffError
from .execution import Job, restore_outputs
from .goldens import CorruptGolden, Golden, GoldenInfo, GoldenStore
from .results import (Listener, Result, RunReport, emit, make_pool, resolve_suites, seeds_for,
                      settings_json, skip_reason, with_timings)
from .suite import case_from_definition, load_suites, select
from .suite.model import TestCase, Tolerance
from .verdicts import Verdict


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
            {p.name: p.to_json() for p in presets}, settings_json(settings, in_process, use_cache))
        done = set()
    baseline_of: dict[tuple[str, int], str] = {}

    with writer:
        for test_id, seed, verdict, message, case in decided:
            for preset in presets:
                if (test_id, seed, preset.name) not in done:
                    emit(writer, Result(test_id, seed, preset.name, verdict, case, message),
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
                        emit(writer, Result(case.id, seed, preset.name, Verdict.CORRUPT, case, str(exc)),
                              item.golden_info.baseline, results, listener)
                    continue
                baseline_of[(case.id, seed)] = item.golden_info.baseline
                for preset in todo:
                    reason = skip_reason(case, preset.name)
                    tol = tolerance_for(case.tolerance, preset, tolerance)
                    if reason:
                        emit(writer, Result(case.id, seed, preset.name, Verdict.SKIPPED, case, reason,
                                             tolerance=tol), item.golden_info.baseline, results, listener)
                        continue
                    key = f"{case.id}\0{seed}\0{preset.name}"
                    goldens[key] = golden
                    meta[key] = (item, preset, tol)
                    yield Job(case=case, seed=seed, invocation=golden.invocation, preset=preset,
                              repeats=settings.repeats, warmup=settings.warmup,
                              cache_dir=settings.cache if use_cache else None, key=key)

        with make_pool(settings, in_process) as pool:
            for outcome in pool.run(jobs()):
                golden = goldens.pop(outcome.key)
                item, preset, tol = meta.pop(outcome.key)
                case = item.case
                result = with_timings(Result(case.id, item.seed, preset.name, Verdict.PASS, case,
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
                emit(writer, result, item.golden_info.baseline, results, listener)
        wall = time.perf_counter() - started
        report = RunReport(writer.run_id, writer.path, "check", results, wall)
        writer.end(report.counts(), wall)
    return report
