"""The work one planned check item makes: results decided without running (a skip, the
planned verdict, a golden found corrupt or missing when read) and, for every other
preset, the job a worker runs on exactly the stored inputs and weights (`CheckJob`),
with what judging its outcome needs (run/judge.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..backends.base import Preset
from ..compare.results import Result
from ..compare.tolerance import tolerance_for
from ..core.config import Settings
from ..core.verdicts import LOWERING_FAILURES, Verdict
from ..execution.cache import ArtifactCache, cache_key
from ..execution.gradients import can_differentiate
from ..execution.job import Outcome, WorkerContext
from ..execution.references import REDUCED, needs_control
from ..execution.runner import Job
from ..goldens import CorruptGolden, Golden, GoldenStore, MissingGolden, store_key
from ..goldens.validate import definition_findings
from ..suite.model import TestCase, Tolerance
from ..suite.selection import profile_skip, skip_reason
from .check_plan import Planned
from .judge import Pending


@dataclass
class CheckJob(Job):
    """A check job. When the target cannot lower the test, the same worker goes on to
    lower each op of the test's graph alone, so the result lists every op the target
    cannot take, not only the first (execution.op_survey)."""

    survey_ops: bool = True

    def run(self, context: WorkerContext = WorkerContext()) -> Outcome:
        outcome = super().run(context)
        # an int8 preset is not surveyed: each op alone would be quantized apart, from other
        # calibration, and its failure is named from the whole graph (its backend's message)
        if not (self.survey_ops and outcome.status in LOWERING_FAILURES and self.invocation is not None
                and self.preset.scheme is None):
            outcome.survey = None
            return outcome
        from ..execution.op_survey import survey_test

        if outcome.survey is not None:   # remembered with a cached failure
            return outcome
        cache_dir = self.cache_in(context)
        outcome.survey = survey = survey_test(self.case, self.invocation, self.preset, cache_dir,
                                              threads=context.threads)
        if cache_dir is not None and survey.lasting:
            remember_survey(self, cache_dir, survey.to_json())
        return outcome


def remember_survey(job: Job, cache_dir: Path | str, survey: dict[str, Any]) -> None:
    """Add a survey to the failure the artifact cache remembers for `job` (if it does)."""
    cache = ArtifactCache(cache_dir)
    key = cache_key(job)
    record = cache.failure(key)
    if record is not None:
        record.survey = survey
        cache.remember_failure(key, record)


def job_key(test_id: str, seed: int, preset: str) -> str:
    """The handle of one check job, echoed back in its Outcome."""
    return f"{test_id}\0{seed}\0{preset}"


def _static_only(case: TestCase | None, preset: Preset) -> str:
    """Why a sized test (dynamic shapes) is not checked on `preset` ("": it is): the preset
    exports static shapes only, which is no verdict on the backend; the test it sizes is
    checked at its static shapes."""
    if case is None or case.dynamic is None:
        return ""
    from ..backends.registry import backend_for

    try:
        refusal = backend_for(preset).dynamic_refusal(preset)
    except Exception:   # a broken plugin: its job runs, and fails where it fails
        return ""
    return (f"{preset.name} does not export dynamic shapes: {refusal}; the test this sizes is checked at "
            "its static shapes") if refusal else ""


def item_work(item: Planned, presets: Sequence[Preset], store: GoldenStore, *,
              skips: Sequence[tuple[str, str]] = (), tolerance: Tolerance | None = None,
              settings: Settings = Settings(), use_cache: bool = True, require_delegated: bool = False
              ) -> tuple[list[Result], list[tuple[Job, Pending]]]:
    """What checking one planned (test, seed) on `presets` takes: the results decided
    without running (a skip, the planned verdict, a golden found corrupt or missing when
    read), and a job with what judging its outcome needs for every other preset."""
    decided: list[Result] = []

    def out(preset: Preset, verdict: Verdict, message: str) -> None:
        decided.append(Result.of(item.case, item.test_id, item.seed, preset.name, verdict, message,
                                 baseline=item.baseline))

    runnable = []
    for preset in presets:
        reason = (skip_reason(item.case, preset.name, skips, item.test_id)
                  or profile_skip(item.case, preset.precision) or _static_only(item.case, preset))
        if reason:
            out(preset, Verdict.SKIPPED, reason)
        elif item.verdict is not None:
            out(preset, item.verdict, item.message)
        else:
            runnable.append(preset)
    if not runnable:
        return decided, []
    try:
        golden = store.read(item.test_id, item.seed)
        _check_definition(golden, store)
    except (CorruptGolden, MissingGolden) as exc:
        verdict = Verdict.CORRUPT if isinstance(exc, CorruptGolden) else Verdict.NO_GOLDEN
        for preset in runnable:
            out(preset, verdict, str(exc))
        return decided, []
    runs: list[tuple[Job, Pending]] = []
    assert item.case is not None, "a planned item without a verdict has its test case"
    for preset in runnable:
        tol = tolerance_for(item.case.tolerance, preset, tolerance)
        job = CheckJob(case=item.case, seed=item.seed, invocation=golden.invocation, preset=preset,
                       repeats=settings.repeats, warmup=settings.warmup,
                       cache_dir=settings.cache if use_cache else None,
                       key=job_key(item.test_id, item.seed, preset.name),
                       grads=grad_request(item.case, golden, preset),
                       elementwise=preset.precision in REDUCED, control=needs_control(preset))
        runs.append((job, Pending(item, golden, preset, tol, require_delegated)))
    return decided, runs


def grad_request(case: TestCase, golden: Golden, preset: Preset) -> list | None:
    """The recorded cotangent, for a grad test whose golden has gradients, on a preset whose
    backend can differentiate; None otherwise (an int8 preset too: its gradients are the
    float module's)."""
    if not case.grad or golden.grads is None or not can_differentiate(preset) or preset.scheme is not None:
        return None
    return list(golden.grads.cotangent)


def _check_definition(golden: Golden, store: GoldenStore) -> None:
    """Raise CorruptGolden when the golden's stored definition does not rebuild, or does
    not hash to its spec hash (the check `opdiff goldens verify` makes too). Reached only
    for goldens planning found current, so a mismatch here is an edited definition. Not
    redundant after planning from goldens: a module test rebuilt there from its suite on
    disk hashes as recorded even when the stored definition was edited."""
    found = definition_findings(golden.test_id, golden.definition, golden.suite, golden.spec_hash,
                                golden.test_type)
    wrong = found.problems or found.stale
    if wrong:
        raise CorruptGolden(golden.test_id, golden.seed, "", wrong[0],
                            store.where(store_key(golden.test_id, golden.seed)))
