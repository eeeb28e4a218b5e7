"""`opdiff check`: goldens -> target preset -> compare -> verdicts in the history.

Plan first, then run. Planning decides, for every selected (test, seed), what can be
said without running anything: NO_GOLDEN, STALE (spec hash changed, or the test is gone
from the suites), CORRUPT (unreadable metadata or definition), SKIPPED (a suite `skip`
matching the preset). Everything else becomes one Job per preset, run in the worker pool
on exactly the stored inputs and weights; an array that fails its checksum at read time
is CORRUPT too. Each result is written to the history as soon as it is known.

Without suites (no ./suites, none given) every golden is checked against the definition
stored in it; `--test-ids` and `--tags` select on that definition, and a `file:` module
that changed since record still makes the golden STALE.

Pair tests: the target runs both sides on the same inputs, and each side is compared
with its own side of the golden: PASS means a matches golden a and b matches golden b.
How far b is from a on the target is a metric (`b_vs_a`), not the verdict; the message
names the side that drifted, and says so when the golden's sides agree but the
target's do not.

Gradients: for a `grad: true` test whose golden holds gradients, on a preset whose
backend can differentiate, the worker recomputes the recorded vector-Jacobian product
after the forward pass, and judge compares it. A gradient mismatch makes the item
MISMATCH with a message that says so; its metrics go under `metrics["grad"]`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..backends.base import Delegation, Preset
from ..backends.registry import get_preset
from ..compare.gradients import compare_grads
from ..compare.numerics import Comparison, compare
from ..compare.results import Listener, Result, RunReport
from ..compare.rules import Rounding
from ..compare.tolerance import tolerance_for
from ..compare.vacuous import vacuous_reason
from ..core.config import Settings, apply_endpoint
from ..core.errors import OpdiffError
from ..core.safetext import printable
from ..core.verdicts import LOWERING_FAILURES, GoldenState, Verdict
from ..execution.cache import ArtifactCache, cache_key, cache_unusable, holds_artifacts_of
from ..execution.gradients import can_differentiate
from ..execution.job import Outcome, WorkerContext
from ..execution.prepare import nest_residuals, restore_outputs
from ..execution.references import REDUCED, needs_control
from ..execution.runner import Job
from ..goldens import CorruptGolden, Golden, GoldenInfo, GoldenStore, MissingGolden, key_of_unknown, store_key
from ..goldens.cases import GoldenCases, UntrustedGolden
from ..goldens.model import golden_state
from ..goldens.store import BaselineFailure
from ..goldens.validate import definition_findings
from ..history import runs as history
from ..history import sharding
from ..suite import load_suites, select
from ..suite import suite_paths as find_suites
from ..suite.model import TestCase, Tolerance
from ..suite.selection import check_seeds, seeds_for, skip_reason
from .pipeline import Pipeline, Running, Selection, Sinks
from .session import make_pool, notice, set_total, settings_json, warn


@dataclass
class Planned:
    """One selected (test, seed). `verdict` is set when it is decided without running."""

    test_id: str
    seed: int
    case: TestCase | None
    info: GoldenInfo | None
    verdict: Verdict | None = None
    message: str = ""

    @property
    def baseline(self) -> str | None:
        return self.info.baseline if self.info is not None and self.info.baseline else None


@dataclass
class Pending:
    """What judging one job's outcome needs: the planned item, its golden, the preset and
    the tolerance it is judged with."""

    item: Planned
    golden: Golden
    preset: Preset
    tol: Tolerance
    require_delegated: bool = False   # a fallback off the delegate fails the result


@dataclass
class CheckPlan:
    items: list[Planned] = field(default_factory=list)


def _corrupt(test_id: str, seed: int, info: GoldenInfo | None, why: str) -> Planned:
    why = printable(why)   # read from the golden: shown escaped
    key = key_of_unknown(test_id)
    if key is not None:   # an entry whose test cannot be told (GoldenStore.index)
        return Planned(test_id, seed, None, info, Verdict.CORRUPT,
                       f"the entry {key} of the golden store is corrupt: {why}. It will not be "
                       "compared. Remove it, and re-record the test it held with `opdiff record`.")
    return Planned(test_id, seed, None, info, Verdict.CORRUPT,
                   f"the golden of test '{test_id}' seed {seed} is corrupt: {why}. It will not be "
                   f"compared. Re-record it with `opdiff record --test-ids '{test_id}' --force`.")


def _stale_message(info: GoldenInfo, case: TestCase) -> str:
    return ("the test or its file: module changed since the golden was recorded "
            f"(spec {info.spec_hash[:12]} -> {case.spec_hash[:12]}); re-record it with `opdiff record`")


def _failed_message(failed: BaselineFailure) -> str:
    reason = failed.reason.removeprefix(f"baseline {failed.baseline}: ").rstrip(". ")
    return (f"no golden: the baseline {failed.baseline} failed on this test when it was recorded "
            f"({failed.at[:19]}): {reason}. Fix the test (or give it a `skip:`), then run `opdiff record`")


def plan_from_suites(cases: list[TestCase], store: GoldenStore, *, seeds: int | None = None,
                     seed_list: Sequence[int] | None = None, test_ids=None, tags=None,
                     report_orphans: bool = True) -> CheckPlan:
    """Selected cases x seeds against the store. With `report_orphans` (every suite of the
    project was loaded and nothing narrowed the selection), goldens of tests that no
    longer exist are STALE and unreadable ones CORRUPT."""
    by_key = {info.key: info for info in store.index()}
    current = {c.id: c.spec_hash for c in cases}
    failures = store.baseline_failures()
    plan = CheckPlan()
    claimed: set[str] = set()
    for case in select(cases, test_ids, tags):
        for seed in seeds_for(case, seeds, seed_list):
            key = store_key(case.id, seed)
            info = by_key.get(key)
            claimed.add(key)
            state = GoldenState.MISSING if info is None else golden_state(info, current)
            failed = failures.get(key)
            if state is GoldenState.MISSING and failed is not None and failed.spec_hash == case.spec_hash:
                plan.items.append(Planned(case.id, seed, case, None, Verdict.BASELINE_FAIL, _failed_message(failed)))
            elif state is GoldenState.MISSING:
                plan.items.append(Planned(case.id, seed, case, None, state.verdict,
                                          "no golden recorded; run `opdiff record`"))
            elif state is GoldenState.CORRUPT and info is not None:
                item = _corrupt(case.id, seed, info, info.problem)
                item.case = case
                plan.items.append(item)
            elif state is GoldenState.STALE and info is not None:
                plan.items.append(Planned(case.id, seed, case, info, state.verdict, _stale_message(info, case)))
            else:
                plan.items.append(Planned(case.id, seed, case, info))
    if report_orphans and not test_ids and not tags:
        for key, info in sorted(by_key.items()):
            state = golden_state(info, current)
            if key in claimed or state not in (GoldenState.CORRUPT, GoldenState.ORPHAN):
                continue  # claimed, or a seed of a known test that was not asked for
            if state is GoldenState.CORRUPT:
                plan.items.append(_corrupt(info.test_id, info.seed, info, info.problem))
            else:
                plan.items.append(Planned(info.test_id, info.seed, None, info, state.verdict,
                                          "golden of a test that no longer exists in the suites; "
                                          "`opdiff goldens prune` removes it"))
    return plan


def plan_from_goldens(store: GoldenStore, *, seeds: int | None = None,
                      seed_list: Sequence[int] | None = None, test_ids=None, tags=None,
                      cases: GoldenCases | None = None) -> CheckPlan:
    """Every golden, each against the test definition stored in it, rebuilt under the
    trust rules of goldens/cases.py (raises UntrustedGolden naming every golden that
    would import code no suite vouches for)."""
    cases = cases if cases is not None else GoldenCases()
    wanted_seeds = set(seed_list) if seed_list else (set(range(seeds)) if seeds is not None else None)
    plan = CheckPlan()
    untrusted: list[tuple[str, int, list[str]]] = []
    for info in store.index():
        if wanted_seeds is not None and info.seed not in wanted_seeds:
            continue
        if info.problem:
            if not test_ids and not tags:  # its id and tags are unknown: only in an unnarrowed check
                plan.items.append(_corrupt(info.test_id, info.seed, info, info.problem))
            continue
        try:
            definition = store.read_definition(info.test_id, info.seed)
        except CorruptGolden as exc:
            plan.items.append(_corrupt(info.test_id, info.seed, info, exc.reason))
            continue
        found = definition_findings(info.test_id, definition, info.suite, info.spec_hash, info.test_type)
        if found.problems:  # a malformed stored definition, or one edited after record
            plan.items.append(_corrupt(info.test_id, info.seed, info, found.problems[0]))
            continue
        if not select([found.case], test_ids, tags):
            continue
        try:   # rebuilt from data, so only what the trust rules allow (goldens/cases.py)
            case = cases.case(info.test_id, info.seed, definition, info.suite)
        except UntrustedGolden as exc:
            untrusted.extend(exc.found)
            continue
        if case.spec_hash != info.spec_hash:
            plan.items.append(Planned(case.id, info.seed, case, info, Verdict.STALE, _stale_message(info, case)))
        else:
            plan.items.append(Planned(case.id, info.seed, case, info))
    if untrusted:
        raise UntrustedGolden(untrusted)
    return plan


# ---------------------------------------------------------------- verdicts of one outcome

def judge(pending: Pending, outcome: Outcome) -> Result:
    """The Result of one finished job: the backend's failure, or the comparison with the
    golden (each side of a pair with its own golden side)."""
    item, golden, preset, tol = pending.item, pending.golden, pending.preset, pending.tol
    case = item.case
    result = Result.of(case, item.test_id, item.seed, preset.name, Verdict.PASS, tolerance=tol,
                       baseline=item.baseline).with_outcome(outcome)
    if outcome.status is not None:
        result.verdict = outcome.status
        return result
    result.vacuous = vacuous_reason(golden.outputs, tol)
    actual = restore_outputs(outcome.output_structure, outcome.outputs or [])
    rounding = rounding_for(golden, preset, outcome.output_structure, outcome.elementwise)
    cmp = compare(golden.outputs, actual, tol, rounding=rounding)
    result.verdict, result.message = cmp.verdict, cmp.message
    result.metrics = cmp.metrics.to_json() if cmp.metrics is not None else None
    if cmp.verdict is Verdict.MISMATCH:
        _control(result, golden, outcome, tol, rounding, cmp, preset)
    if case is not None and case.pair is not None:
        _judge_pair(result, case, golden, actual, tol, cmp)
    if result.verdict is Verdict.PASS:
        _check_grads(result, pending, outcome)
    if result.verdict is Verdict.PASS and result.delegation is not None and result.delegation.fallback and \
            (pending.require_delegated or preset.options.get("require_delegated")):
        result.verdict, result.message = Verdict.NOT_DELEGATED, not_delegated_message(result.delegation)
    return result


def rounding_for(golden: Golden, preset: Preset, structure: Any = None,
                 elementwise: list | None = None) -> Rounding:
    """What a target's outputs are judged with against `golden` (compare.numerics.Rounding):
    the golden's float64 reference, the precisions, and the elementwise reference (flat, as a
    job computes it for `structure`) when there is one."""
    nested = None if elementwise is None else nest_residuals(structure, elementwise, golden.outputs)
    return Rounding(golden.reference, str(golden.baseline.get("precision") or "fp32"), preset.precision, nested)


def _control(result: Result, golden: Golden, outcome: Outcome, tol: Tolerance, rounding: Rounding,
             cmp: Comparison, preset: Preset) -> None:
    """A MISMATCH on fp16/bf16: judge torch eager at the same precision the same way. When
    it fails too, by at least half as much, the result is precision-limited: the loss is the
    precision's, and the backend is not where to look first. On torch eager on the CPU the
    target's own outputs are that control."""
    if needs_control(preset):
        if outcome.control is None:
            return
        control = compare(golden.outputs, restore_outputs(outcome.output_structure, outcome.control), tol,
                          rounding=rounding)
    elif preset.precision in REDUCED:
        control = cmp   # torch eager on the CPU: the comparison just made is the control's
    else:
        return
    target_abs = cmp.metrics.max_abs if cmp.metrics is not None else 0.0
    control_abs = control.metrics.max_abs if control.metrics is not None else 0.0
    result.precision_limited = control.verdict is Verdict.MISMATCH and control_abs >= 0.5 * target_abs
    result.metrics = {**(result.metrics or {}), "control": {
        "verdict": control.verdict.value, "max_abs": control_abs,
        "failed_bound": control.metrics.failed_bound if control.metrics is not None else None}}
    if result.precision_limited:
        result.message = (f"precision-limited: torch eager in {rounding.target_precision} on the same inputs "
                          f"fails the same comparison (max_abs {control_abs:.3g} against this backend's "
                          f"{target_abs:.3g}); look at the precision before the backend. " + result.message)


def not_delegated_message(d: Delegation) -> str:
    ops = "; ".join(f"{o.op} x{o.fallback}" + (f" ({o.sources[0]})" if o.sources else "") for o in d.fallback_ops())
    return (f"{d.fallback} of {d.fallback + d.delegated} op nodes stayed off the {d.delegate} delegate, and "
            f"every one must be on it (--require-delegated): {ops}. The outputs match the golden.")


def _judge_pair(result: Result, case: TestCase, golden: Golden, actual: Any, tol: Tolerance,
                cmp: Comparison) -> None:
    """Name the side that drifted, and keep b vs a on the target in the metrics."""
    on_target = compare(actual["a"], actual["b"], tol, root="b_vs_a")
    result.metrics = {**(result.metrics or {}), "b_vs_a": {
        "verdict": on_target.verdict.value,
        **(on_target.metrics.to_json() if on_target.metrics is not None else {})}}
    if cmp.passed:
        return
    impls = {"a": case.call.impl, "b": case.pair.impl if case.pair else None}
    drifted = [side for side in ("a", "b") if any(p.startswith(f"out[{side!r}]") for p in cmp.failing)]
    named = " and ".join(f"side {side}" + (f" ({impls[side]})" if impls[side] else "") for side in drifted)
    verb, whose = ("drift", "their") if len(drifted) > 1 else ("drifts", "its")
    notes = [f"{named} {verb} from {whose} golden"] if drifted else []
    if not on_target.passed and compare(golden.outputs["a"], golden.outputs["b"], tol).passed:
        max_abs = on_target.metrics.max_abs if on_target.metrics else float("nan")
        notes.append(f"the golden's sides agree but on {result.preset} they do not (b vs a: "
                     f"{on_target.verdict.value}, max_abs={max_abs:.3g})")
    if notes:
        result.message = "; ".join(notes) + ": " + result.message


def _check_grads(result: Result, pending: Pending, outcome: Outcome) -> None:
    """Gradient parity: the worker recomputed the recorded vector-Jacobian product on the
    target (see _grad_request); compare it with the golden's."""
    if outcome.grads_error is not None:
        result.verdict, result.error_class = Verdict.INFER_FAIL, "GradientError"
        result.message = f"the forward pass matched; computing the gradients failed: {outcome.grads_error}"
        return
    if outcome.grads is None:
        return  # not asked: no gradients recorded, or the preset cannot differentiate
    cmp = compare_grads(pending.golden.grads["grads"], outcome.grads, pending.tol)
    grad_metrics = cmp.metrics.to_json() if cmp.metrics is not None else {}
    result.metrics = {**(result.metrics or {}), "grad": {"verdict": cmp.verdict.value, **grad_metrics}}
    if cmp.verdict is not Verdict.PASS:
        result.verdict = Verdict.MISMATCH
        result.message = (f"the forward pass matched, the gradient does not ({cmp.verdict.value}): "
                          f"{cmp.message}")


def _grad_request(case: TestCase, golden: Golden, preset: Preset) -> list | None:
    """The recorded cotangent, for a grad test whose golden has gradients, on a preset whose
    backend can differentiate; None otherwise."""
    if not case.grad or golden.grads is None or not can_differentiate(preset):
        return None
    return list(golden.grads["cotangent"])


def _prior_results(path: Path) -> list[Result]:
    """The items an interrupted run already holds (for the summary, JSON and JUnit)."""
    out = []
    for item in history.read_run(path).items:
        try:
            out.append(Result.from_json(item))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------- check

@dataclass(frozen=True)
class CheckRequest:
    """What one check runs: the target presets (with `preset_options` per preset name),
    the selection, `skips` ((test id or prefix*, preset or glob) pairs reported SKIPPED),
    a tolerance override, a run to `resume`, and `shard=(K, N)`: the K-th of N shards of
    the planned (test, seed, preset) jobs (history/sharding.py), whose `run_group` names the
    logical run the N shards make up."""

    backends: Sequence[str]
    selection: Selection = Selection()
    running: Running = Running()
    preset_options: Mapping[str, str | dict] | None = None
    skips: Sequence[tuple[str, str]] = ()
    tolerance: Tolerance | None = None
    resume: str | None = None
    trust_goldens: bool = False
    shard: tuple[int, int] | None = None
    run_group: str | None = None
    require_delegated: bool = False   # any op node left off a delegate fails the result (NOT_DELEGATED)

    def refusal(self) -> str | None:
        """Why these options cannot make a check, before anything is read."""
        if self.shard is not None and not self.run_group:
            return (f"--shard {self.shard[0]}/{self.shard[1]} needs --run-group ID, the same for all "
                    f"{self.shard[1]} shards (a CI run id, say): the shards agree on their split through "
                    "it, and `opdiff runs` and the reports take them as one run.")
        if not self.backends:
            return "check needs at least one --backend PRESET (see `opdiff list-presets`)."
        if self.tolerance is not None:
            for name in ("atol", "rtol", "baseline_factor"):
                value = getattr(self.tolerance, name)
                if value is not None and not (math.isfinite(value) and value >= 0):
                    return f"--{name.replace('_', '-')} {value}: it must be a finite number >= 0."
        if len(set(self.backends)) != len(self.backends):
            return f"--backend names a preset twice ({', '.join(self.backends)}); give each once."
        unknown = [name for name in self.preset_options or {} if name not in self.backends]
        if unknown:
            return (f"--preset-options names '{unknown[0]}', which is not a --backend of this "
                    f"check ({', '.join(self.backends)}).")
        return None


def check(request: CheckRequest, *, settings: Settings = Settings(), argv: Sequence[str] = (),
          listener: Listener | None = None) -> RunReport:
    """Run each target preset on exactly the stored inputs and weights and compare.

    A `listener` with a `set_total(n)` method is told how many results to expect.
    With `running.python`, the workers run under that interpreter (another environment's
    packages); planning, comparing and the history stay here, and the run's meta line
    records the workers' environment."""
    apply_endpoint(settings)
    sel, running = request.selection, request.running
    check_seeds(sel.seeds, sel.seed_list)
    why = request.refusal()
    if why:
        raise OpdiffError(why)
    options = request.preset_options or {}
    presets = [get_preset(name, options.get(name)) for name in request.backends]
    use_cache = running.use_cache and cache_usable(settings, listener)
    store = GoldenStore(settings.goldens)
    if not store.exists():
        raise OpdiffError(f"no golden store at {settings.goldens}. Run `opdiff record --baseline "
                          "torch_cpu_fp32` first, or point --goldens at an existing store.")
    # the workers start, and warm up the backends of presets that will export, while the run is planned
    pool = make_pool(settings, running.in_process, listener, running.python)
    try:
        pool.prestart([p for p in presets if not (use_cache and holds_artifacts_of(settings.cache, p.name))])
        suite_paths, plan, golden_cases = _plan(request, store, settings, listener)
        # a worker interpreter that cannot serve, or a run that cannot resume, is refused before anything is written
        env = pool.environment()
        if pool.python is not None:
            notice(listener, f"workers run under {pool.python} (torch {env.get('torch')}, "
                   + ", ".join(f"{k} {env[k]}" for k in ("executorch", "onnxruntime", "coremltools")
                               if env.get(k)) + ")")
        run_settings = settings_json(settings, running.in_process, use_cache, pool)
        if not suite_paths and golden_cases.imported:
            run_settings["trusted_imports"] = list(golden_cases.imported)
        identity = plan_identity(plan, suite_paths, presets, request, python=pool.python)
        writer, planned, done = _open_run(request, plan, presets, identity, settings, argv, suite_paths,
                                          run_settings, env)
        prior = _prior_results(writer.path) if request.resume else []
    except BaseException:
        pool.close()
        raise
    set_total(listener, len(planned) - len(done & planned))
    started = time.perf_counter()

    def work() -> Iterator[Result | tuple[Job, Pending]]:
        for item in plan.items:
            todo = [p for p in presets if (item.test_id, item.seed, p.name) in planned
                    and (item.test_id, item.seed, p.name) not in done]
            if todo:
                decided, runs = item_work(item, todo, store, skips=request.skips, tolerance=request.tolerance,
                                          settings=settings, use_cache=use_cache,
                                          require_delegated=request.require_delegated)
                yield from decided
                yield from runs

    with writer:
        sinks = Sinks(listener, writer)
        Pipeline(judge, sinks).drive(pool, work())
        wall = time.perf_counter() - started
        _all_present(writer, planned)
        writer.end(RunReport(writer.run_id, writer.path, "check", sinks.results, wall).counts(), wall)
    return RunReport(writer.run_id, writer.path, "check", prior + sinks.results, wall)


def _plan(request: CheckRequest, store: GoldenStore, settings: Settings, listener: Listener | None
          ) -> tuple[list[Path], CheckPlan, GoldenCases]:
    """The check's plan: from the suites, or from the goldens alone when there are none."""
    sel = request.selection
    suite_paths = find_suites(sel.suites, settings.suites)
    golden_cases = GoldenCases(trust=request.trust_goldens)   # used only when no suite is given
    if suite_paths:
        plan = plan_from_suites(load_suites(suite_paths), store, seeds=sel.seeds, seed_list=sel.seed_list,
                                test_ids=sel.test_ids, tags=sel.tags, report_orphans=not sel.suites)
    else:
        plan = plan_from_goldens(store, seeds=sel.seeds, seed_list=sel.seed_list, test_ids=sel.test_ids,
                                 tags=sel.tags, cases=golden_cases)
        if golden_cases.imported:
            notice(listener, "--trust-goldens: the workers of this check import "
                   + ", ".join(golden_cases.imported) + ", as the goldens' definitions name them")
    if not plan.items and sel.narrowed:
        raise OpdiffError(f"no test matches --test-ids {list(sel.test_ids or [])} / --tags {list(sel.tags or [])}; "
                          "`opdiff list-tests` shows the ids. Nothing was checked.")
    return suite_paths, plan, golden_cases


def _open_run(request: CheckRequest, plan: CheckPlan, presets: Sequence[Preset], identity: dict[str, Any],
              settings: Settings, argv: Sequence[str], suite_paths: Sequence[Path], run_settings: dict[str, Any],
              env: dict[str, Any]) -> tuple[history.RunWriter, set[history.ItemKey], set[history.ItemKey]]:
    """The run's history file (a new one, or the one `request.resume` names, when it planned
    exactly this), the (test, seed, preset) keys this run covers, and those it already holds."""
    shard = request.shard
    planned = {(i.test_id, i.seed, p.name) for i in plan.items for p in presets}
    if shard is not None:
        identity["shard"] = {"index": shard[0], "count": shard[1], "group": request.run_group}
    if request.resume:
        stored: dict[str, Any] = {}

        def accept(run: history.RunFile) -> None:
            _same_plan(run, identity)
            stored.update((run.meta or {}).get("plan", {}).get("shard") or {})

        writer, done = history.RunWriter.resume(settings.store, request.resume, accept=accept)
        if shard is not None:
            planned = {(str(t), int(s), str(p)) for t, s, p in stored.get("keys") or []}
        return writer, planned, done
    if shard is not None:
        assert request.run_group is not None
        planned = set(_shard_keys(plan, presets, shard, request.run_group, settings))
        identity["shard"]["keys"] = sorted([list(k) for k in planned])
    writer = history.RunWriter.start(
        settings.store, "check", list(argv), [str(p) for p in suite_paths],
        {p.name: p.to_json() for p in presets}, run_settings, env=env, plan=identity,
        run_group=request.run_group, shard=f"{shard[0]}/{shard[1]}" if shard else None)
    return writer, planned, set()


@dataclass
class CheckJob(Job):
    """A check job. When the target cannot lower the test, the same worker goes on to
    lower each op of the test's graph alone, so the result lists every op the target
    cannot take, not only the first (cause.lowering)."""

    survey_ops: bool = True

    def run(self, context: WorkerContext = WorkerContext()) -> Outcome:
        outcome = super().run(context)
        if not (self.survey_ops and outcome.status in LOWERING_FAILURES and self.invocation is not None):
            outcome.survey = None
            return outcome
        from ..cause.lowering import survey_test

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
        reason = skip_reason(item.case, preset.name, skips, item.test_id)
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
                  grads=_grad_request(item.case, golden, preset),
                  elementwise=preset.precision in REDUCED, control=needs_control(preset))
        runs.append((job, Pending(item, golden, preset, tol, require_delegated)))
    return decided, runs


def _shard_keys(plan: CheckPlan, presets: Sequence[Preset], shard: tuple[int, int], group: str,
                settings: Settings) -> list[sharding.Key]:
    """This shard's (test, seed, preset) keys, from the split the group's shards agree on."""
    keys = [(i.test_id, i.seed, p.name) for i in plan.items for p in presets]
    decided = [(i.test_id, i.seed, p.name) for i in plan.items for p in presets if i.verdict is not None]

    def compute() -> list[list[sharding.Key]]:
        known = sharding.history_costs(history.readable_dir(settings.store), settings.repeats, settings.warmup)
        return sharding.partition(keys, sharding.expected_costs(keys, known, decided), shard[1])

    split, _ = sharding.agreed_split(settings.store, keys, shard[1], group, compute)
    return split[shard[0] - 1]


def plan_identity(plan: CheckPlan, suite_paths: Sequence[Path], presets: Sequence[Preset],
                  request: CheckRequest, python: Path | None = None) -> dict[str, Any]:
    """What a resumed run must reproduce exactly: the suites, the selection, the planned
    (test, seed, spec hash) items, the presets with their options, the tolerance override,
    and the workers' interpreter when it is not this one. Stored in the run's meta line;
    JSON only."""
    sel, tolerance = request.selection, request.tolerance
    return json.loads(json.dumps({
        **({"python": str(python)} if python is not None else {}),
        "suites": [str(p) for p in suite_paths],
        "selection": {"test_ids": list(sel.test_ids or []), "tags": list(sel.tags or []), "seeds": sel.seeds,
                      "seed_list": list(sel.seed_list or []), "skips": [list(x) for x in request.skips],
                      "trust_goldens": bool(request.trust_goldens)},
        "presets": {p.name: dict(p.options) for p in presets},
        "tolerance": None if tolerance is None else {k: getattr(tolerance, k)
                                                     for k in ("atol", "rtol", "baseline_factor")},
        "items": [[i.test_id, i.seed, (i.case.spec_hash if i.case is not None else None) or
                   (i.info.spec_hash if i.info is not None else "")] for i in plan.items],
    }))


def _same_plan(run: history.RunFile, identity: dict[str, Any]) -> None:
    """Refuse to resume unless this invocation plans exactly what the run planned."""
    run_id = run.path.stem
    resumable, why = history.resumability(run.meta or {})
    if not resumable:
        raise OpdiffError(f"run '{run_id}' cannot be resumed: {why}.")
    meta = run.meta or {}
    differences = plan_differences(meta["plan"], identity)
    if differences:
        argv = " ".join(a for a in (meta.get("argv") or []) if a != "--resume")
        raise OpdiffError(f"run '{run_id}' planned something else, so resuming it with this command "
                          f"would mix two runs: {'; '.join(differences)}. Resume with the original command "
                          f"(`opdiff {argv} --resume {run_id}`), or start a new run.")


def plan_differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One phrase per way `now` differs from `before` (plan_identity dicts)."""
    out = []
    for key in ("suites", "presets", "tolerance", "python"):
        if before.get(key) != now.get(key):
            out.append(f"{key} {before.get(key)!r} then, {now.get(key)!r} now")
    shard_then, shard_now = ({k: v for k, v in (d.get("shard") or {}).items() if k != "keys"} or None
                             for d in (before, now))
    if shard_then != shard_now:
        out.append(f"shard {shard_then!r} then, {shard_now!r} now")
    for key, value in (now.get("selection") or {}).items():
        was = (before.get("selection") or {}).get(key)
        if was != value:
            out.append(f"{key} {was!r} then, {value!r} now")
    then = {(i[0], i[1]): i[2] for i in before.get("items") or []}
    current = {(i[0], i[1]): i[2] for i in now.get("items") or []}

    def names(keys) -> str:
        keys = sorted(keys)
        shown = ", ".join(f"{t} seed {s}" for t, s in keys[:3])
        return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    gone, new = then.keys() - current.keys(), current.keys() - then.keys()
    changed = [k for k in then.keys() & current.keys() if then[k] != current[k]]
    if gone:
        out.append(f"{len(gone)} planned test(s) are not planned now ({names(gone)})")
    if new:
        out.append(f"{len(new)} test(s) are planned now that were not ({names(new)})")
    if changed:
        out.append(f"{len(changed)} test(s) changed since (spec hash: {names(changed)})")
    return out


def _all_present(writer: history.RunWriter, planned: set[tuple[str, int, str]]) -> None:
    """The end line goes only under a run holding every planned item exactly once."""
    missing, foreign = planned - writer.keys, writer.keys - planned
    if not (missing or foreign or writer.duplicates):
        return
    parts = ([f"{len(missing)} planned results missing"] if missing else []) + \
            ([f"{len(foreign)} results that were not planned"] if foreign else []) + \
            ([f"{len(writer.duplicates)} results written twice"] if writer.duplicates else [])
    writer.close()
    raise OpdiffError(f"run '{writer.run_id}' was left without its end line: it holds {', '.join(parts)}. "
                      f"Its file is {writer.path}; `opdiff runs` shows it, and a new check starts clean.")


def cache_usable(settings: Settings, listener: Listener | None) -> bool:
    """Whether the artifact cache can be used; when not, the listener is warned once and the
    check exports without it."""
    why = cache_unusable(settings.cache)
    if why:
        warn(listener, f"the artifact cache {settings.cache} cannot be written ({why}); this check exports "
                       "without it, as with --no-cache (its run records cache: false). Make it writable, "
                       "or pass --cache DIR.")
    return not why


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
