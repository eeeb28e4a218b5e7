"""`opdiff record`: suites -> seeded inputs -> baseline -> goldens.

For every selected (test, seed) the recorder first decides, from the golden store's
metadata alone, what to do (`plan`):

    SKIPPED        the suite excludes the baseline preset for this test (no golden)
    KEPT           a golden exists, was made from the same spec (hash) by the same
                   baseline preset, and --force was not given
    to record      no golden, a stale one (spec changed), one from another baseline,
                   one whose metadata is unreadable, or --force

Each one to record becomes a job: a worker materialises it (seeded inputs and module
weights: the suite's code runs there, never here), runs the baseline, runs it again in
float64 for the golden's reference, and for a test with `grad: true` records its
gradients (eager torch on CPU in the golden's dtypes, whatever the baseline preset is, so
they never depend on a backend's autograd support). When the baseline produced outputs
the golden is written (atomically; see goldens/store.py). Any failure on the way
(materialising, the baseline, the gradients, a value the store cannot hold, a worker
that died) makes the item BASELINE_FAIL with the reason, writes no golden and never stops
the run. Every item goes to the run's history file
(meta line, one item per (test, seed), end line).

Into a remote store the goldens are written by a few threads while the run goes on
(GoldenStore.write_later); an item reaches the history file and the listener, in the
order the run met them, only once its golden is in the store, and the end line only once
all are. A golden that cannot be written stops the run with its GoldenWriteError (the
items after it are not reported; their goldens that were written stay, and are kept by
the next record).
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..backends.base import Preset
from ..backends.registry import availability, get_preset
from ..compare.results import Listener, Result, RunReport
from ..compare.vacuous import op_of, vacuous_reason
from ..core import trees
from ..core.config import Settings, apply_endpoint, parse_executor
from ..core.environment import environment
from ..core.errors import OpdiffError
from ..core.verdicts import Verdict
from ..execution.job import Outcome
from ..execution.outputs import nest_residuals, restore_outputs
from ..execution.pools import make_pool
from ..execution.runner import Job
from ..goldens import Golden, GoldenInfo, GoldenStore
from ..goldens.cases import GoldenCases
from ..goldens.ledger import BaselineFailure
from ..history.writer import RunStart, RunWriter
from ..storage.run_store import utc_now
from ..suite import load_suites, select
from ..suite import suite_paths as find_suites
from ..suite.model import Invocation, RecordedGrads, TestCase
from ..suite.reader import SuiteReader
from ..suite.selection import check_seeds, seeds_for, skip_reason
from .pipeline import Pipeline, Sinks
from .requests import RecordRequest
from .session import set_total, settings_json, warn


@dataclass
class Planned:
    """One (test, seed) the recorder has decided about. `verdict` is SKIPPED or KEPT
    when nothing is to run, None when the baseline must run; `why` says which."""

    case: TestCase
    seed: int
    verdict: Verdict | None
    why: str


def plan(cases: Sequence[TestCase], store: GoldenStore, preset: Preset, *, seeds: int | None = None,
         seed_list: Sequence[int] | None = None, force: bool = False,
         skips: Sequence[tuple[str, str]] = ()) -> Iterator[Planned]:
    """What record does with each (test, seed), decided from metadata only."""
    for case in cases:
        for seed in seeds_for(case, seeds, seed_list):
            reason = skip_reason(case, preset.name, skips)
            if reason:
                yield Planned(case, seed, Verdict.SKIPPED, reason)
                continue
            info = store.info(case.id, seed)
            why = _why_record(case, info, preset, force)
            yield Planned(case, seed, None if why else Verdict.KEPT, why or "golden is up to date")


def _why_record(case: TestCase, info: GoldenInfo | None, preset: Preset, force: bool) -> str:
    """Why this golden must be (re)written; "" when the stored one is to be kept."""
    if info is None:
        return "new golden"
    if info.problem:
        return f"the stored golden is unreadable ({info.problem}); replaced"
    if info.spec_hash != case.spec_hash:
        return f"stale: the test changed since its golden was recorded ({info.created[:19]}); replaced"
    if info.baseline != preset.name:
        return f"the stored golden came from baseline '{info.baseline}'; replaced"
    if force:
        return "--force; replaced"
    return ""


def record(request: RecordRequest, *, settings: Settings = Settings(), argv: Sequence[str] = (),
           listener: Listener | None = None) -> RunReport:
    """Run the baseline on freshly materialised inputs and store goldens for every
    (test, seed) that has none or a stale one (or all of them with `force`).

    Raises OpdiffError (before anything is written) for an unknown preset, a preset that
    cannot run here, no suites, an invalid suite, or a selection that matches nothing.
    A `listener` with a `set_total(n)` method is told how many results to expect."""
    apply_endpoint(settings)
    sel, in_process = request.selection, request.running.in_process
    check_seeds(sel.seeds, sel.seed_list)
    preset = get_preset(request.baseline, request.preset_options)
    local = in_process or parse_executor(settings.executor)[0] == "local"
    avail = availability(preset)
    if local and not (avail.can_export and avail.can_run):
        raise OpdiffError(f"preset '{preset.name}' cannot be the baseline on this machine: {avail.reason}. "
                          "Pick a preset that runs here (see `opdiff list-presets`).")
    reader = SuiteReader()
    suite_paths = find_suites(sel.suites, settings.suites, reader)
    if not suite_paths:
        raise OpdiffError(f"no suites found under {settings.suites}. Give suite files, or create "
                          "suites there (see docs/suite-format.md).")
    all_cases = load_suites(suite_paths, reader=reader)
    cases = select(all_cases, sel.test_ids, sel.tags)
    if not cases and sel.narrowed:
        raise OpdiffError(f"no test among the {len(all_cases)} of {', '.join(map(str, suite_paths))} "
                          f"matches --test-ids {list(sel.test_ids or [])} / --tags {list(sel.tags or [])}. "
                          "See `opdiff list-tests` for the ids.")
    store = GoldenStore(settings.goldens)
    for problem in store.ledger_problems():
        warn(listener, f"the golden store's baseline failures: {problem}; this record writes over what it "
                       "records again")
    planned = list(plan(cases, store, preset, seeds=sel.seeds, seed_list=sel.seed_list, force=request.force,
                        skips=request.skips))
    if any(item.verdict is None for item in planned):
        store.check_writable()  # before any baseline runs: a read-only store fails here, not at the end
    set_total(listener, len(planned))
    pool = make_pool(settings, in_process, listener)
    why = None if local else pool.unavailable(preset)   # a cluster is asked once it is joined
    if why:
        pool.close()
        raise OpdiffError(f"preset '{preset.name}' cannot be the baseline: {why}.")
    recorder = _Recorder(store, preset, environment(threads=pool.threads), listener)

    def work() -> Iterator[Result | tuple[Job, Planned]]:
        """Jobs for the items to record; the others are reported as they are met. The
        worker materialises each job's inputs and weights: that runs the suite's code."""
        for item in planned:
            case, seed = item.case, item.seed
            if item.verdict is not None:
                yield Result.of(case, case.id, seed, preset.name, item.verdict, item.why, baseline=preset.name)
                continue
            yield Job(case=case, seed=seed, invocation=None, preset=preset, repeats=settings.repeats,
                      warmup=settings.warmup, cache_dir=None, key=f"{case.id}\0{seed}",
                      reference=request.reference, grads="record" if case.grad else None), item

    started = time.perf_counter()
    with RunWriter.start(settings.store, RunStart(
            "record", list(argv), [str(p) for p in suite_paths], {preset.name: preset.to_json()},
            settings_json(settings, in_process, False, pool), baseline_preset=preset.name,
            env=recorder.env)) as writer:
        sinks = Sinks(listener, writer)
        written = _Written(sinks, recorder)
        try:
            Pipeline(recorder.judge, written).drive(pool, work())
            written.finish()
        finally:
            store.stop_writes()
        wall = time.perf_counter() - started
        report = RunReport(writer.run_id, writer.path, "record", sinks.results, wall)
        writer.end(report.counts(), wall)
    return report


class _Recorder:
    """Judges a record job: its outcome becomes a golden in the store, or BASELINE_FAIL."""

    def __init__(self, store: GoldenStore, preset: Preset, env: dict[str, Any], listener: Listener | None = None):
        self.store, self.preset, self.env, self.listener = store, preset, env, listener
        self.writes: dict[tuple[str, int], Future[str]] = {}   # (test id, seed) -> its golden on its way

    def judge(self, item: Planned, outcome: Outcome) -> Result:
        result = Result.of(item.case, item.case.id, item.seed, self.preset.name, Verdict.RECORDED,
                           baseline=self.preset.name).with_outcome(outcome)
        if outcome.status is not None or outcome.invocation is None:
            result.verdict = Verdict.BASELINE_FAIL
            status = outcome.status.value if outcome.status is not None else "no inputs came back"
            result.message = f"baseline {self.preset.name}: {status}: {outcome.error_message or 'no detail'}"
            return self._failed(item, result, outcome.status)
        result.message = item.why
        if item.case.grad and outcome.grads is None:
            result.verdict, result.error_class = Verdict.BASELINE_FAIL, "GradientError"
            result.message = f"recording gradients (grad: true) failed: {outcome.grads_error or 'no detail'}"
            return self._failed(item, result)
        golden = golden_of(item.case, item.seed, self.preset, self.env, outcome.invocation, outcome)
        try:
            self.writes[(item.case.id, item.seed)] = self.store.write_later(golden)
        except (TypeError, ValueError) as exc:  # a value the store cannot hold (OSError stops the run)
            result.verdict, result.error_class = Verdict.BASELINE_FAIL, type(exc).__name__
            result.message = f"the golden cannot be stored: {exc}"
            return self._failed(item, result)
        result.vacuous = vacuous_reason(golden.outputs, op=op_of(item.case))
        if result.vacuous:
            warn(self.listener, f"test '{item.case.id}' seed {item.seed}: the golden proves nothing: {result.vacuous}")
        return result

    def _failed(self, item: Planned, result: Result, status: Verdict | None = None) -> Result:
        """The store remembers the failure, so check says BASELINE_FAIL with this reason
        (not NO_GOLDEN) until a record of the test succeeds. A timeout may be the machine's
        load rather than the test, and a golden already in place stays what check uses."""
        if status is Verdict.TIMEOUT or self.store.info(item.case.id, item.seed) is not None:
            return result
        self.store.note_baseline(item.case.id, item.seed, BaselineFailure(
            item.case.id, item.seed, item.case.spec_hash, self.preset.name, result.message,
            datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")))
        return result


class _Written:
    """The sink of a record run: hands each result on in the order it came, once the
    golden it recorded (if any) is in the store, and then forgets a baseline failure noted
    for it. A golden that could not be written raises its GoldenWriteError there."""

    def __init__(self, sink: Callable[[Result], None], recorder: _Recorder):
        self.sink, self.recorder = sink, recorder
        self.waiting: deque[tuple[Result, Future[str] | None]] = deque()

    def __call__(self, result: Result) -> None:
        self.waiting.append((result, self.recorder.writes.pop((result.test_id, result.seed), None)))
        self._hand_on(wait=False)

    def finish(self) -> None:
        """Wait for every golden still on its way and hand the last results on."""
        self._hand_on(wait=True)

    def _hand_on(self, wait: bool) -> None:
        while self.waiting:
            result, write = self.waiting[0]
            if write is not None:
                if not (wait or write.done()):
                    return
                write.result()
                self.recorder.store.note_baseline(result.test_id, result.seed, None)
            self.waiting.popleft()
            self.sink(result)


def golden_of(case: TestCase, seed: int, baseline: Preset, env: dict[str, Any], invocation: Invocation,
              outcome: Outcome, grads: bool = True) -> Golden:
    """The golden of a baseline outcome: its outputs restored, the float64 residuals, the
    definition and where it was recorded (`grads`: keep the recorded gradients)."""
    outputs = restore_outputs(outcome.output_structure, outcome.outputs or [])
    reference, note = reference_of(outcome, outputs)
    return Golden(test_id=case.id, seed=seed, spec_hash=case.spec_hash, suite=str(case.suite),
                  definition=dict(case.definition), test_type=case.test_type,
                  baseline={"name": baseline.name, **baseline.to_json()}, env=env,
                  created=utc_now(), invocation=invocation, outputs=outputs,
                  grads=outcome.grads if grads and isinstance(outcome.grads, RecordedGrads) else None,
                  reference=reference, reference_note=note)


def reference_of(outcome: Outcome, outputs: Any) -> tuple[Any, str | None]:
    """(residuals of `outputs` against the float64 reference of a job run with
    `reference=True`, None), or (None, why there are none)."""
    if outcome.reference is None:
        return None, outcome.reference_note or "no float64 reference was computed"
    residuals = nest_residuals(outcome.output_structure, outcome.reference, outputs)
    if not trees.flatten(residuals)[1]:
        return None, "the float64 run's outputs have other shapes than the baseline's"
    return residuals, None




# ---------------------------------------------------------------- references for older goldens

def add_references(suites: Sequence[Path] | None = None, *, test_ids: Sequence[str] | None = None,
                   force: bool = False, in_process: bool = False, trust_goldens: bool = False,
                   settings: Settings = Settings(), listener: Listener | None = None) -> list[Result]:
    """Give goldens recorded without a float64 reference one, keeping their outputs: each
    runs in float64 on its stored inputs and weights, and the difference to the stored
    outputs is added. With `force`, goldens that have one are measured again.

    Results: RECORDED (reference added), KEPT (had one), BASELINE_FAIL (the test cannot
    be rebuilt here); a test that does not run in float64 keeps the reason in its golden."""
    from ..suite.selection import id_matches, parse_patterns

    store = GoldenStore(settings.goldens)
    if not store.exists():
        raise OpdiffError(f"no golden store at {settings.goldens}; nothing to add references to.")
    reader = SuiteReader()
    paths = find_suites(suites, settings.suites, reader)
    rebuild = GoldenCases(trust_goldens, paths, reader)
    known = rebuild.vouching()   # the suites pointed at: loaded once, also to vouch
    patterns = parse_patterns(test_ids) if test_ids else None
    preset = get_preset("torch_cpu_fp32")
    sinks = Sinks(listener)

    def work() -> Iterator[Result | tuple[Job, Golden]]:
        for info in store.index():
            if info.problem or (patterns and not id_matches(info.test_id, patterns)):
                continue
            golden = store.read(info.test_id, info.seed)
            if not force and (golden.reference is not None or golden.reference_note is not None):
                yield Result(info.test_id, info.seed, preset.name, Verdict.KEPT, "has a reference")
                continue
            case = known.get(info.test_id)
            if case is None or case.spec_hash != info.spec_hash:
                try:
                    case = rebuild.case(info.test_id, info.seed, golden.definition, golden.suite)
                except OpdiffError as exc:
                    yield Result(info.test_id, info.seed, preset.name, Verdict.BASELINE_FAIL, str(exc))
                    continue
            yield Job(case=case, seed=info.seed, invocation=golden.invocation, preset=preset, repeats=1,
                      warmup=0, key=f"{info.test_id}\0{info.seed}", reference=True), golden

    def judge(golden: Golden, outcome: Outcome) -> Result:
        if outcome.status is not None:
            return Result(golden.test_id, golden.seed, preset.name, Verdict.BASELINE_FAIL,
                          f"{outcome.status.value}: {outcome.error_message or 'no detail'}")
        golden.reference, golden.reference_note = reference_of(outcome, golden.outputs)
        store.write(golden)
        return Result(golden.test_id, golden.seed, preset.name, Verdict.RECORDED,
                      golden.reference_note or "float64 reference added")

    Pipeline(judge, sinks).drive(make_pool(settings, in_process), work())
    return sinks.results
