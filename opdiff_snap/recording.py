"""`opdiff record`: suites -> seeded inputs -> baseline -> goldens."""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator, Sequence
from pathlib import Path

from . import history
from .backends.registry import availability, get_preset
from .config import Settings
from .errors import OpdiffError
from .execution import Job, restore_outputs
from .goldens import Golden, GoldenStore
from .results import (Listener, Result, RunReport, emit, make_pool, resolve_suites, seeds_for,
                      settings_json, skip_reason, with_timings)
from .suite import load_suites, materialize, select
from .suite.model import TestCase
from .verdicts import Verdict


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
                                 {preset.name: preset.to_json()}, settings_json(settings, in_process, False),
                                 baseline_preset=preset.name) as writer:

        def jobs() -> Iterator[Job]:
            for case in cases:
                for seed in seeds_for(case, seeds, seed_list):
                    reason = skip_reason(case, preset.name)
                    if reason:
                        emit(writer, Result(case.id, seed, preset.name, Verdict.SKIPPED, case, reason),
                              None, results, listener)
                        continue
                    info = store.info(case.id, seed)
                    if info is not None and info.spec_hash == case.spec_hash and not force:
                        emit(writer, Result(case.id, seed, preset.name, Verdict.KEPT, case,
                                             "golden is up to date"), None, results, listener)
                        continue
                    try:
                        invocation = materialize(case, seed)
                    except OpdiffError as exc:
                        emit(writer, Result(case.id, seed, preset.name, Verdict.BASELINE_FAIL, case,
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
        with make_pool(settings, in_process) as pool:
            for outcome in pool.run(remember(jobs())):
                case, seed = pending.pop(outcome.key)
                invocation = invocations.pop(outcome.key)
                result = with_timings(Result(case.id, seed, preset.name, Verdict.RECORDED, case), outcome)
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
                emit(writer, result, None, results, listener)
        wall = time.perf_counter() - started
        report = RunReport(writer.run_id, writer.path, "record", results, wall)
        writer.end(report.counts(), wall)
    return report


