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

Gradients: for a `grad: true` test whose golden holds gradients, on a preset that can
differentiate (cause.gradients.can_differentiate), the recorded vector-Jacobian product
is recomputed *in this process* after the forward result came back and passed (a few
small tests; no isolation, see docs/check.md). A gradient mismatch makes the item
MISMATCH with a message that says so; its metrics go under `metrics["grad"]`.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import history
from .backends.base import Preset
from .backends.registry import get_preset
from .compare import Comparison, Rounding, compare, tolerance_for
from .config import Settings
from .environment import environment
from .errors import OpdiffError
from .execution import Job, Outcome, restore_outputs
from .execution.cache import cache_unusable
from .execution.runner import error_text
from .goldens import CorruptGolden, Golden, GoldenInfo, GoldenStore, MissingGolden, store_key
from .goldens.validate import definition_findings
from .results import (Listener, Result, RunReport, emit, make_pool, resolve_suites, seeds_for,
                      settings_json, skip_reason, with_timings)
from .suite import load_suites, select
from .suite.model import TestCase, Tolerance
from .verdicts import Verdict


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
class _Pending:
    item: Planned
    golden: Golden
    preset: Preset
    tol: Tolerance


@dataclass
class CheckPlan:
    items: list[Planned] = field(default_factory=list)

    def total(self, n_presets: int) -> int:
        return len(self.items) * n_presets


def _corrupt(test_id: str, seed: int, info: GoldenInfo | None, why: str) -> Planned:
    return Planned(test_id, seed, None, info, Verdict.CORRUPT,
                   f"the golden of test '{test_id}' seed {seed} is corrupt: {why}. It will not be "
                   f"compared. Re-record it with `opdiff record --test-ids '{test_id}' --force`.")


def _stale_message(info: GoldenInfo, case: TestCase) -> str:
    return ("the test or its file: module changed since the golden was recorded "
            f"(spec {info.spec_hash[:12]} -> {case.spec_hash[:12]}); re-record it with `opdiff record`")


def plan_from_suites(cases: list[TestCase], store: GoldenStore, *, seeds: int | None = None,
                     seed_list: Sequence[int] | None = None, test_ids=None, tags=None,
                     report_orphans: bool = True) -> CheckPlan:
    """Selected cases x seeds against the store. With `report_orphans` (every suite of the
    project was loaded and nothing narrowed the selection), goldens of tests that no
    longer exist are STALE and unreadable ones CORRUPT."""
    by_key = {info.key: info for info in store.index()}
    plan = CheckPlan()
    claimed: set[str] = set()
    for case in select(cases, test_ids, tags):
        for seed in seeds_for(case, seeds, seed_list):
            key = store_key(case.id, seed)
            info = by_key.get(key)
            claimed.add(key)
            if info is None:
                plan.items.append(Planned(case.id, seed, case, None, Verdict.NO_GOLDEN,
                                          "no golden recorded; run `opdiff record`"))
            elif info.problem:
                item = _corrupt(case.id, seed, info, info.problem)
                item.case = case
                plan.items.append(item)
            elif info.spec_hash != case.spec_hash:
                plan.items.append(Planned(case.id, seed, case, info, Verdict.STALE, _stale_message(info, case)))
            else:
                plan.items.append(Planned(case.id, seed, case, info))
    if report_orphans and not test_ids and not tags:
        known = {c.id for c in cases}
        for key, info in sorted(by_key.items()):
            if key in claimed or (info.test_id in known and not info.problem):
                continue  # a seed of a known test that was not asked for
            if info.problem:
                plan.items.append(_corrupt(info.test_id, info.seed, info, info.problem))
            else:
                plan.items.append(Planned(info.test_id, info.seed, None, info, Verdict.STALE,
                                          "golden of a test that no longer exists in the suites; "
                                          "`opdiff goldens prune` removes it"))
    return plan


def plan_from_goldens(store: GoldenStore, *, seeds: int | None = None,
                      seed_list: Sequence[int] | None = None, test_ids=None, tags=None) -> CheckPlan:
    """Every golden, each against the test definition stored in it."""
    wanted_seeds = set(seed_list) if seed_list else (set(range(seeds)) if seeds is not None else None)
    plan = CheckPlan()
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
        case = found.case
        if not select([case], test_ids, tags):
            continue
        if case.spec_hash != info.spec_hash:
            plan.items.append(Planned(case.id, info.seed, case, info, Verdict.STALE, _stale_message(info, case)))
        else:
            plan.items.append(Planned(case.id, info.seed, case, info))
    return plan


# ---------------------------------------------------------------- verdicts of one outcome

def judge(pending: _Pending, outcome: Outcome) -> Result:
    """The Result of one finished job: the backend's failure, or the comparison with the
    golden (each side of a pair with its own golden side)."""
    item, golden, preset, tol = pending.item, pending.golden, pending.preset, pending.tol
    case = item.case
    result = with_timings(Result(item.test_id, item.seed, preset.name, Verdict.PASS, case, tolerance=tol), outcome)
    if outcome.status is not None:
        result.verdict = outcome.status
        return result
    actual = restore_outputs(outcome.output_structure, outcome.outputs)
    rounding = Rounding(golden.reference, str(golden.baseline.get("precision") or "fp32"), preset.precision)
    cmp = compare(golden.outputs, actual, tol, rounding=rounding)
    result.verdict, result.message = cmp.verdict, cmp.message
    result.metrics = cmp.metrics.to_json() if cmp.metrics is not None else None
    if case.pair is not None:
        _judge_pair(result, case, golden, actual, tol, cmp)
    if result.verdict is Verdict.PASS:
        _check_grads(result, pending)
    return result


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
    notes = [f"{named} {'drift' if len(drifted) > 1 else 'drifts'} from {'their' if len(drifted) > 1 else 'its'} golden"] if drifted else []
    if not on_target.passed and compare(golden.outputs["a"], golden.outputs["b"], tol).passed:
        notes.append(f"the golden's sides agree but on {result.preset} they do not (b vs a: "
                     f"{on_target.verdict.value}, max_abs={(on_target.metrics.max_abs if on_target.metrics else float('nan')):.3g})")
    if notes:
        result.message = "; ".join(notes) + ": " + result.message


def _check_grads(result: Result, pending: _Pending) -> None:
    """Gradient parity in this process (see the module docstring)."""
    from .cause.gradients import can_differentiate, check_grads, unpack_grads

    case, golden, preset = pending.item.case, pending.golden, pending.preset
    if not case.grad or golden.grads is None or not can_differentiate(preset):
        return
    try:
        cotangent, expected = unpack_grads(golden.grads)
        cmp = check_grads(case, golden.invocation, cotangent, expected, preset, pending.tol)
    except Exception as exc:  # noqa: BLE001 - a failing backward is a verdict, not a crash
        result.verdict = Verdict.INFER_FAIL
        result.error_class = type(exc).__name__
        result.message = f"the forward pass matched; computing the gradients failed: {error_text(exc)}"
        return
    if cmp is None:
        return
    grad_metrics = cmp.metrics.to_json() if cmp.metrics is not None else {}
    result.metrics = {**(result.metrics or {}), "grad": {"verdict": cmp.verdict.value, **grad_metrics}}
    if cmp.verdict is not Verdict.PASS:
        result.verdict = Verdict.MISMATCH
        result.message = (f"the forward pass matched, the gradient does not ({cmp.verdict.value}): "
                          f"{cmp.message}")


def _prior_results(path: Path) -> list[Result]:
    """The items an interrupted run already holds, as Results (for the summary, JSON and JUnit)."""
    out = []
    for it in history.read_run(path).items:
        try:
            verdict = Verdict(str(it.get("status")))
            out.append(Result(str(it["id"]), int(it["seed"]), str(it["preset"]), verdict, None,
                              it.get("error_message") or "", error_class=it.get("error_class"),
                              export_ms=it.get("export_ms"), load_ms=it.get("load_ms"),
                              infer_ms=it.get("infer_ms"), infer_ms_all=list(it.get("infer_ms_all") or []),
                              cache_hit=bool(it.get("cache_hit")),
                              tolerance=Tolerance(**it["tolerance"]) if it.get("tolerance") else None,
                              metrics=it.get("metrics")))
        except (KeyError, TypeError, ValueError):
            continue
    return out


# ---------------------------------------------------------------- check

def check(suites: Sequence[Path] | None = None, *, backends: Sequence[str],
          preset_options: dict[str, str | dict] | None = None, seeds: int | None = None,
          seed_list: Sequence[int] | None = None, test_ids: Sequence[str] | None = None,
          tags: Sequence[str] | None = None, skips: Sequence[tuple[str, str]] = (),
          tolerance: Tolerance | None = None, resume: str | None = None, in_process: bool = False, use_cache: bool = True,
          settings: Settings = Settings(), argv: Sequence[str] = (),
          listener: Listener | None = None) -> RunReport:
    """Run each target preset on exactly the stored inputs and weights and compare.

    `skips` are (test id or prefix*, preset or glob) pairs reported SKIPPED.
    A `listener` with a `set_total(n)` method is told how many results to expect."""
    if not backends:
        raise OpdiffError("check needs at least one --backend PRESET (see `opdiff list-presets`).")
    if tolerance is not None:
        for name in ("atol", "rtol", "baseline_factor"):
            value = getattr(tolerance, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise OpdiffError(f"--{name.replace('_', '-')} {value}: it must be a finite number >= 0.")
    if len(set(backends)) != len(backends):
        raise OpdiffError(f"--backend names a preset twice ({', '.join(backends)}); give each once.")
    options = preset_options or {}
    unknown = [name for name in options if name not in backends]
    if unknown:
        raise OpdiffError(f"--preset-options names '{unknown[0]}', which is not a --backend of this "
                          f"check ({', '.join(backends)}).")
    presets = [get_preset(name, options.get(name)) for name in backends]
    if use_cache:
        why = cache_unusable(settings.cache)
        if why:
            warnings.warn(cache_fallback_message(settings.cache, why), RuntimeWarning, stacklevel=2)
            use_cache = False
    store = GoldenStore(settings.goldens)
    if not store.exists():
        raise OpdiffError(f"no golden store at {settings.goldens}. Run `opdiff record --baseline "
                          "torch_cpu_fp32` first, or point --goldens at an existing store.")
    suite_paths = resolve_suites(suites, settings)
    if suite_paths:
        plan = plan_from_suites(load_suites(suite_paths), store, seeds=seeds, seed_list=seed_list,
                                test_ids=test_ids, tags=tags, report_orphans=not suites)
    else:
        plan = plan_from_goldens(store, seeds=seeds, seed_list=seed_list, test_ids=test_ids, tags=tags)
    if not plan.items and (test_ids or tags):
        raise OpdiffError(f"no test matches --test-ids {list(test_ids or [])} / --tags {list(tags or [])}; "
                          "`opdiff list-tests` shows the ids. Nothing was checked.")

    results: list[Result] = []      # this session's
    prior: list[Result] = []
    pool = make_pool(settings, in_process)
    if resume:
        writer, done = history.RunWriter.resume(settings.store, resume)
        _same_presets(writer, presets)
        prior = _prior_results(writer.path)
    else:
        writer = history.RunWriter.start(
            settings.store, "check", list(argv), [str(p) for p in suite_paths],
            {p.name: p.to_json() for p in presets}, settings_json(settings, in_process, use_cache, pool),
            env=environment(threads=pool.threads))
        done = set()
    set_total = getattr(listener, "set_total", None)
    if callable(set_total):
        set_total(plan.total(len(presets)) - len(done))
    started = time.perf_counter()

    with writer:
        pending: dict[str, _Pending] = {}

        def out(item: Planned, preset: Preset, verdict: Verdict, message: str, **kw: Any) -> None:
            emit(writer, Result(item.test_id, item.seed, preset.name, verdict, item.case, message, **kw),
                 item.baseline, results, listener)

        def jobs() -> Iterator[Job]:
            for item in plan.items:
                todo = [p for p in presets if (item.test_id, item.seed, p.name) not in done]
                runnable = []
                for preset in todo:
                    reason = skip_reason(item.case, preset.name, skips, item.test_id)
                    if reason:
                        out(item, preset, Verdict.SKIPPED, reason)
                    elif item.verdict is not None:
                        out(item, preset, item.verdict, item.message)
                    else:
                        runnable.append(preset)
                if not runnable:
                    continue
                try:
                    golden = store.read(item.test_id, item.seed)
                    _check_definition(golden, store)
                except (CorruptGolden, MissingGolden) as exc:
                    verdict = Verdict.CORRUPT if isinstance(exc, CorruptGolden) else Verdict.NO_GOLDEN
                    for preset in runnable:
                        out(item, preset, verdict, str(exc))
                    continue
                for preset in runnable:
                    key = f"{item.test_id}\0{item.seed}\0{preset.name}"
                    tol = tolerance_for(item.case.tolerance, preset, tolerance)
                    pending[key] = _Pending(item, golden, preset, tol)
                    yield Job(case=item.case, seed=item.seed, invocation=golden.invocation, preset=preset,
                              repeats=settings.repeats, warmup=settings.warmup,
                              cache_dir=settings.cache if use_cache else None, key=key)

        with pool:
            for outcome in pool.run(jobs()):
                p = pending.pop(outcome.key)
                emit(writer, judge(p, outcome), p.item.baseline, results, listener)
        wall = time.perf_counter() - started
        writer.end(RunReport(writer.run_id, writer.path, "check", results, wall).counts(), wall)
    return RunReport(writer.run_id, writer.path, "check", prior + results, wall)


def cache_fallback_message(cache: Path, why: str) -> str:
    return (f"the artifact cache {cache} cannot be written ({why}); this check exports without it, "
            "as with --no-cache (its run records cache: false). Make it writable, or pass --cache DIR.")


def _check_definition(golden: Golden, store: GoldenStore) -> None:
    """Raise CorruptGolden when the golden's stored definition does not rebuild, or does
    not hash to its spec hash (the check `opdiff goldens verify` makes too). Reached only
    for goldens planning found current, so a mismatch here is an edited definition."""
    found = definition_findings(golden.test_id, golden.definition, golden.suite, golden.spec_hash,
                                golden.test_type)
    wrong = found.problems or found.stale
    if wrong:
        raise CorruptGolden(golden.test_id, golden.seed, "", wrong[0],
                            store.root / store_key(golden.test_id, golden.seed))


def _same_presets(writer: history.RunWriter, presets: list[Preset]) -> None:
    if writer.meta.get("command") != "check":
        writer.close()
        raise OpdiffError(f"run '{writer.run_id}' is a `{writer.meta.get('command')}` run; "
                          "--resume finishes interrupted check runs only.")
    recorded = writer.meta.get("presets") or {}
    if set(recorded) != {p.name for p in presets}:
        writer.close()
        raise OpdiffError(f"run '{writer.run_id}' checked {', '.join(sorted(recorded)) or 'no presets'}; "
                          f"resuming it needs the same --backend list (got "
                          f"{', '.join(p.name for p in presets)}).")
    for p in presets:
        if json.loads(json.dumps(recorded[p.name].get("options") or {})) != json.loads(json.dumps(dict(p.options))):
            writer.close()
            raise OpdiffError(f"run '{writer.run_id}' ran {p.name} with options "
                              f"{recorded[p.name].get('options')}; resuming it needs the same "
                              "--preset-options.")
