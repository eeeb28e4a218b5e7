"""Run one Job in the current process: availability -> prepare -> export (cached) ->
load -> warm-up -> timed repeats -> outputs.

Every failure becomes an Outcome with a status and the exception's class and first
lines; nothing raises out of `run_job` except KeyboardInterrupt / SystemExit.

Precision rule: a reduced-precision preset (fp16/bf16) may return float16/bfloat16
where the eager module produced float32 (or float64). Such outputs are cast back to
the dtype the eager module produced, which `prepare` probes with one eager call; an
output the eager module itself produced in float16 stays float16. Integer, bool and
fp32-preset outputs are never cast: a dtype difference there is a finding.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..backends.base import Artifact, Availability, Backend, Delegation, Preset, Runnable
from ..core.errors import error_text
from ..core.verdicts import Verdict
from ..suite.materialize import materialize
from ..suite.model import Invocation, RecordedGrads, TestCase
from .bundling import BundleTarget, Returned, write_piece
from .cache import ArtifactCache, FailureRecord, cache_key, deterministic
from .export_load import Export, export_and_load
from .int8_reference import calibration_inputs
from .job import Outcome, WorkerContext
from .op_support import Survey
from .outputs import count_outputs, restore_outputs
from .prepare import Prepared, flat_module
from .references import elementwise_reference, float64_reference, precision_control

_REDUCED = (torch.float16, torch.bfloat16)


def _fail(job: Job, status: Verdict, exc: BaseException | str, **timings: Any) -> Outcome:
    if isinstance(exc, BaseException):
        return Outcome(job.key, status, error_class=type(exc).__name__, error_message=error_text(exc),
                       **timings)
    return Outcome(job.key, status, error_message=exc, **timings)


def _backend(job: Job) -> Backend:
    from ..backends.registry import backend_for
    return backend_for(job.preset)


@dataclass
class Job:
    """Run one (test, seed) on one preset. Picklable: it travels to worker processes."""

    case: TestCase
    seed: int
    invocation: Invocation | None   # None: materialise it in the worker (record)
    preset: Preset
    repeats: int = 1
    warmup: int = 1
    cache_dir: Path | str | None = None   # artifact cache root (a folder or a URL); None: no cache
    key: str = ""                   # caller's handle, echoed back in the Outcome
    reference: bool = False         # also run the module eagerly in float64 (record)
    # check on fp16/bf16: the float64 result of a single elementwise op on target-rounded
    # inputs, and torch eager at the target's precision (execution/references.py)
    elementwise: bool = False
    control: bool = False
    # gradients too: "record" (eager CPU, the golden's), or the recorded cotangent to
    # recompute them on the preset (check)
    grads: str | list | None = None
    # run this flat module instead of the case's (a part of the test, say, for localize)
    prepared: Prepared | None = None
    # the size of the batch that compiled its artifact in this run (execution/batch.py), whose
    # export time it reports as its own; `alone`: export it by itself, whatever a batch made
    batched: int = 0
    alone: bool = False
    # a replay bundle (execution/bundling.py): write the artifact and the fed inputs there
    # (with the golden's outputs, for ExecuTorch's BundledProgram) instead of running it,
    # or judge what a device `returned` instead of running the artifact here
    bundle: BundleTarget | None = None
    returned: Returned | None = None

    def cache_in(self, context: WorkerContext) -> Path | str | None:
        """The job's artifact cache as the machine running it has it (None: no cache)."""
        return context.cache_dir if self.cache_dir is not None and context.cache_dir is not None else self.cache_dir

    def run(self, context: WorkerContext = WorkerContext()) -> Outcome:
        return run_job(dataclasses.replace(self, cache_dir=self.cache_in(context)), threads=context.threads)

    def failed(self, status: Verdict, error_class: str | None, message: str) -> Outcome:
        return Outcome(self.key, status, error_class=error_class, error_message=message)



def run_job(job: Job, backend: Backend | None = None, threads: int = 0) -> Outcome:
    """Run `job`; `backend` defaults to the registry's backend for the job's preset.

    A job without an invocation (record) first materialises one here, and hands it back in
    the outcome: sampling inputs and constructing modules runs the suite's code, which
    happens in workers only."""
    materialized = job.invocation is None and job.prepared is None
    if materialized:
        try:
            job = dataclasses.replace(job, invocation=materialize(job.case, job.seed))
        except Exception as exc:
            out = _fail(job, Verdict.EXPORT_FAIL, exc)
            out.error_message = f"materialising the inputs failed: {out.error_message}"
            return out
    outcome = _run(job, backend, threads)
    if materialized:
        outcome.invocation = job.invocation
    return outcome


def _run(job: Job, backend: Backend | None, threads: int) -> Outcome:
    try:
        backend = backend if backend is not None else _backend(job)
        avail = backend.availability(job.preset)
    except Exception as exc:  # a broken plug-in or a bug: a failure, never a quiet UNAVAILABLE
        out = _fail(job, Verdict.EXPORT_FAIL, exc)
        out.error_message = f"the backend failed before export (availability check): {out.error_message}"
        return out
    if not avail.can_export:
        return _fail(job, Verdict.UNAVAILABLE, avail.reason or f"preset {job.preset.name} cannot run here")
    try:
        if job.prepared is not None:
            prepared = job.prepared
        else:
            assert job.invocation is not None, "a job without a prepared call carries its invocation"
            prepared = flat_module(job.case, job.invocation)
    except Exception as exc:
        out = _fail(job, Verdict.EXPORT_FAIL, exc)
        out.error_message = f"preparing the test failed before export: {out.error_message}"
        return out
    if count_outputs(prepared.out_structure) == 0:
        return _fail(job, Verdict.STRUCTURE_MISMATCH,
                     f"test '{job.case.id}' returns {_describe(prepared.out_structure)}: nothing to compare; "
                     "make its forward return the result")
    calibration = None    # drawn only when the artifact is not cached
    if job.prepared is None and job.invocation is not None:
        count = int(job.preset.options.get("calibration_samples") or 1)
        calibration = functools.partial(calibration_inputs, job.case, job.invocation, job.seed, count)
    if job.returned is not None and not backend.quantizes(job.preset):
        # a device ran the artifact: nothing to export here (an int8 preset's quantized reference is read below)
        outcome = _from_device(job, prepared)
    elif not backend.serializes or job.cache_dir is not None:
        # nothing to write outside the cache: skip creating (and, slowly, deleting) a temp dir
        outcome = _export_and_run(job, backend, prepared, avail, threads, None, calibration)
    else:
        with tempfile.TemporaryDirectory(prefix="opdiff-job-") as tmp:
            outcome = _export_and_run(job, backend, prepared, avail, threads, Path(tmp), calibration)
    if outcome.status is None:
        if job.reference:
            outcome.reference, outcome.reference_note = float64_reference(prepared)
        if job.elementwise:
            outcome.elementwise = elementwise_reference(prepared, job.preset.precision)[0]
        if job.control:
            outcome.control, outcome.control_note = precision_control(prepared, job.preset.precision)
        if job.grads is not None:
            _gradients(job, outcome)
    elif outcome.status is Verdict.UNAVAILABLE and job.control:
        # exported, not run here: what its outputs will be judged against where they run
        outcome.control, outcome.control_note = precision_control(prepared, job.preset.precision)
        outcome.output_structure = prepared.out_structure
    return outcome


def _describe(structure: Any) -> str:
    if structure.get("value", 0) is None:
        return "None"
    kind = next(iter(structure))
    return f"an empty {kind}" if kind in ("tuple", "list", "dict") and not structure[kind] else "only constants"


def _gradients(job: Job, outcome: Outcome) -> None:
    """Record the gradients on eager CPU torch (`grads="record"`), or recompute them on the
    job's preset for the recorded cotangent; a failure is kept as `grads_error`."""
    from .gradients import compute_grads, record_grads

    try:
        assert job.invocation is not None, "gradients need the job's invocation"
        if job.grads == "record":
            outcome.grads = RecordedGrads(*record_grads(job.case, job.invocation, job.seed))
        else:
            outcome.grads = compute_grads(job.case, job.invocation, list(job.grads or ()), job.preset)
    except Exception as exc:
        outcome.grads_error = error_text(exc)


def _export_and_run(job: Job, backend: Backend, prepared: Prepared, avail: Availability, threads: int,
                    tmp: Path | None, calibration: Callable[[], list] | None = None) -> Outcome:
    use_cache = job.cache_dir is not None and backend.serializes
    cache = ArtifactCache(job.cache_dir) if job.cache_dir is not None and use_cache else None
    key = cache_key(job) if cache is not None else ""
    if cache is not None and job.alone and cache.made_by_batch(key):
        cache.evict(key)
    if cache is not None and job.case.dynamic is not None:
        with cache.exclusive(key):   # its sibling sized tests wait for this export, then load it
            return _export_and_run_keyed(job, backend, prepared, avail, threads, tmp, calibration, cache, key)
    return _export_and_run_keyed(job, backend, prepared, avail, threads, tmp, calibration, cache, key)


def _export_and_run_keyed(job: Job, backend: Backend, prepared: Prepared, avail: Availability, threads: int,
                          tmp: Path | None, calibration: Callable[[], list] | None, cache: ArtifactCache | None,
                          key: str) -> Outcome:
    if cache is not None:
        t0 = time.perf_counter()
        known = cache.failure(key)
        if known is not None:
            return _remembered(job, known, (time.perf_counter() - t0) * 1e3)
    run_here = avail.can_run and job.bundle is None and job.returned is None
    for attempt in (0, 1):  # a cached artifact that fails to load is evicted and rebuilt once
        cached = _Cached(cache, key, job) if cache is not None else None
        if cached is not None:
            step = export_and_load(backend, job.preset, prepared, store=cached, load=run_here,
                                   threads=threads, calibration=calibration)
        else:
            workdir = tmp / f"work{attempt}" if tmp is not None else Path(tempfile.gettempdir())
            step = export_and_load(backend, job.preset, prepared, workdir, load=run_here, threads=threads,
                                   calibration=calibration)
        cache_hit = cached is not None and cached.hit
        batch = cached.batch if cached is not None and cache_hit else None
        reported_hit = cache_hit
        if batch and job.batched and cached is not None and cached.export_ms is not None:
            # compiled for this run: its export is the job's share of the batch's call
            reported_hit, step.export_ms = False, cached.export_ms
        if step.delegation_error is not None and cache is not None and cache_hit and attempt == 0:
            cache.evict(key)   # a cached artifact whose delegation evidence is unreadable: rebuilt once
            continue
        if step.status in (Verdict.EXPORT_FAIL, Verdict.QUANTIZE_FAIL):
            assert step.error is not None and step.status is not None
            if step.rerun_failed:   # this size's quantized reference, not the artifact its sizes share
                return _fail(job, step.status, step.error, export_ms=step.export_ms, cache_hit=reported_hit)
            return _remember(cache, key, _fail(job, step.status, step.error), step.error, job)
        timings = {"export_ms": step.export_ms, "cache_hit": reported_hit}
        if step.status is Verdict.LOAD_FAIL:
            assert step.error is not None
            if cache is not None and cache_hit and attempt == 0:
                cache.evict(key)
                continue
            out = _fail(job, Verdict.LOAD_FAIL, step.error, **timings)
            out.delegation = step.delegation
            return _remember(cache, key, out, step.error, job)
        if job.bundle is not None:
            out = _bundle(job, backend, step.artifact, prepared, **timings)
        elif job.returned is not None:
            out = _from_device(job, prepared)
            made = step.quantized.calibration if step.quantized is not None else ""
            if job.returned.calibration and made and made != job.returned.calibration:
                out = _fail(job, Verdict.STALE, f"the bundle's artifact was quantized from other calibration inputs "
                                                f"({job.returned.calibration}) than this machine's quantized reference "
                                                f"({made}); bundle it again.")
        elif step.runnable is None:
            out = _fail(job, Verdict.UNAVAILABLE, f"exported; cannot run here: {avail.reason}", **timings)
        else:
            # a program its whole batch runs in times the batch, not the test: not timed
            timed = not batch or backend.batch_timed_alone(job.preset)
            out = _infer(job, step.runnable, prepared, timed, export_ms=step.export_ms, load_ms=step.load_ms,
                         cache_hit=reported_hit)
        out.delegation, out.delegation_error, out.batch = step.delegation, step.delegation_error, batch
        out.quantized = step.quantized
        return out
    raise AssertionError("unreachable")


class _Cached:
    """The artifact cache's side of one export (export_load.Store): a complete entry for
    the job's key is loaded instead (`hit`; its original export time stays in the entry's
    entry.json), else the export runs into a new entry."""

    def __init__(self, cache: ArtifactCache, key: str, job: Job):
        self.cache, self.key, self.job = cache, key, job
        self.hit = False
        self.batch: int | None = None           # the hit entry's batch size (None: made alone)
        self.export_ms: float | None = None     # the hit entry's own export time

    def __call__(self, export: Export) -> tuple[Artifact, float]:
        t0 = time.perf_counter()
        entry = self.cache.lookup(self.key)
        if entry is not None:
            artifact = entry.artifact()
            self.hit, self.batch, self.export_ms = True, entry.batch, entry.export_ms
            return artifact, (time.perf_counter() - t0) * 1e3
        entry, export_ms = self.cache.store(
            self.key, export, {"test": self.job.case.id, "seed": self.job.seed, "preset": self.job.preset.name})
        self.cache.note_failed(self.job, False)   # it exports now: it may join a batch again
        return entry.artifact(), export_ms


def _remember(cache: ArtifactCache | None, key: str, out: Outcome, exc: Exception, job: Job) -> Outcome:
    """Keep a deterministic EXPORT_FAIL / LOAD_FAIL under the job's cache key, and the hint
    that the test fails on this preset (batch.plan_batches leaves it out next time)."""
    if cache is not None and deterministic(exc):
        cache.note_failed(job, True)
        delegation = out.delegation.to_json() if out.delegation is not None else None
        cache.remember_failure(key, FailureRecord(out.status.value if out.status else "", out.error_class,
                                                  out.error_message, delegation))
    return out


def _remembered(job: Job, known: FailureRecord, lookup_ms: float) -> Outcome:
    """The outcome of a failure the cache remembers: the same verdict and message, marked
    `cache_hit`, with the survey of the test's ops remembered with it (run/check_job.py)."""
    out = Outcome(job.key, Verdict(known.verdict), error_class=known.error_class,
                  error_message=known.error_message, export_ms=lookup_ms, cache_hit=True)
    out.delegation = Delegation.from_json(known.delegation) if known.delegation else None
    out.survey = Survey.from_json(known.survey) if known.survey else None
    return out


def _infer(job: Job, runnable: Runnable, prepared: Prepared, timed: bool = True, **timings: Any) -> Outcome:
    """Run the artifact: warm-up calls, then the timed ones (`timed` False: one call, no
    latency reported)."""
    times: list[float] = []
    outputs: Any = None
    calls = max(0, job.warmup) + max(1, job.repeats) if timed else 1
    try:
        with torch.no_grad():
            for i in range(calls):
                inputs = prepared.fresh_inputs()
                t0 = time.perf_counter()
                outputs = runnable(inputs)
                dt = (time.perf_counter() - t0) * 1e3
                if timed and i >= max(0, job.warmup):
                    times.append(dt)
        outputs = _finish(outputs, prepared, job)
    except Exception as exc:
        return _fail(job, Verdict.INFER_FAIL, exc, infer_ms_all=times, **timings)
    timing = {"infer_ms": statistics.median(times) if times else None, "infer_ms_all": times, **timings}
    return _outputs(job, prepared, outputs, timing)


def _from_device(job: Job, prepared: Prepared) -> Outcome:
    """The outcome of outputs a device returned (a replay bundle), with its timings."""
    r = job.returned
    assert r is not None
    try:
        outputs = _finish(list(r.outputs), prepared, job)
    except Exception as exc:
        return _fail(job, Verdict.INFER_FAIL, exc)
    times = list(r.infer_ms_all)
    return _outputs(job, prepared, outputs, {"infer_ms": statistics.median(times) if times else None,
                                             "infer_ms_all": times, "load_ms": r.load_ms})


def _bundle(job: Job, backend: Backend, artifact: Artifact | None, prepared: Prepared, **timings: Any) -> Outcome:
    """Write the job's artifact and fed inputs into its bundle; a failure to is EXPORT_FAIL."""
    assert job.bundle is not None and artifact is not None
    try:
        bundled = write_piece(Path(job.bundle.into), job.bundle.entry, backend, job.preset, artifact, prepared,
                              job.bundle.expected)
    except Exception as exc:
        out = _fail(job, Verdict.EXPORT_FAIL, exc, **timings)
        out.error_message = f"exported, but writing it into the bundle failed: {out.error_message}"
        return out
    out = Outcome(job.key, None, output_structure=prepared.out_structure, **timings)
    out.bundled = bundled
    return out


def _outputs(job: Job, prepared: Prepared, outputs: list[torch.Tensor], timing: dict[str, Any]) -> Outcome:
    """The outcome of a run's outputs: STRUCTURE_MISMATCH unless they fit the eager module's."""
    expected = count_outputs(prepared.out_structure)
    if len(outputs) != expected:
        return _fail(job, Verdict.STRUCTURE_MISMATCH,
                     f"the backend returned {len(outputs)} outputs; the eager module returns {expected}",
                     **timing)
    try:  # the parent rebuilds the nested value; make sure it can, here in the isolated worker
        restore_outputs(prepared.out_structure, outputs)
    except (ValueError, RuntimeError) as exc:
        return _fail(job, Verdict.STRUCTURE_MISMATCH, f"the backend's outputs do not fit the eager "
                     f"module's output structure: {exc}", **timing)
    return Outcome(job.key, None, outputs=outputs, output_structure=prepared.out_structure, **timing)


def _finish(outputs: Any, prepared: Prepared, job: Job) -> list[torch.Tensor]:
    """Outputs as a list of detached CPU tensors, reduced-precision ones cast back."""
    if isinstance(outputs, torch.Tensor):
        outputs = [outputs]
    result = []
    for i, t in enumerate(outputs):
        if not isinstance(t, torch.Tensor):
            t = torch.as_tensor(t)
        t = t.detach().cpu()
        eager = prepared.out_dtypes[i] if i < len(prepared.out_dtypes) else None
        if (job.preset.precision != "fp32" and t.dtype in _REDUCED and eager is not None
                and eager.is_floating_point and eager != t.dtype):
            t = t.to(eager)
        result.append(t.contiguous())
    return result
