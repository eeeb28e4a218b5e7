"""Compiling tests in batches: one exporter call for many tests of one preset, each test
then given its own artifact in the artifact cache, so that its job only loads and runs it.

What an exporter call costs is mostly per call (seconds of tracing and pass setup for a
handful of milliseconds of graph), so a check hands a worker a `CompileBatch` of the jobs
it will run, before it runs them. A batch whose call fails loses the tests the backend
names as its cause, or else is halved until the failing tests stand alone; a test left
alone is not compiled here at all, so that its job exports it exactly as it always has
(its verdict, message and survey are what they are alone).
Nothing a batch makes is ever a verdict: a job that finds its artifact made by a batch
and does not PASS is rerun alone (run/check.py), and that run is its verdict.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..backends.base import Artifact, Piece, PiecesFailed, Preset
from ..core.verdicts import Verdict
from .job import WorkerContext

if TYPE_CHECKING:
    from .runner import Job

BATCH_BYTES = 64 << 20      # weights and inputs one batch may hold in all
ALONE_BYTES = 16 << 20      # a test holding more is exported alone: its own call is not what costs


@dataclass
class Compiled:
    """What a CompileBatch made: the jobs (by key) whose artifact is now cached, and
    the size of the batch that made each."""

    key: str
    batches: dict[str, int] = field(default_factory=dict)
    calls: int = 0                   # exporter calls made (halving included)
    export_ms: float = 0.0           # their time in all
    status: Verdict | None = None    # the task itself failed (its worker crashed, timed out)
    error_message: str | None = None
    worker_pid: int | None = None


@dataclass
class CompileBatch:
    """Export `jobs` (one preset, each with its invocation) into the artifact cache in as
    few exporter calls as their failures allow. A pool task (job.Task)."""

    key: str
    preset: Preset
    jobs: list[Job]
    cache_dir: Path | str

    def run(self, context: WorkerContext = WorkerContext()) -> Compiled:
        from ..backends.registry import backend_for
        from .cache import ArtifactCache, cache_key
        from .outputs import count_outputs
        from .prepare import flat_module

        cache_dir = context.cache_dir if context.cache_dir is not None else self.cache_dir
        out = Compiled(self.key)
        backend = backend_for(self.preset)
        if not (backend.batches(self.preset) and backend.availability(self.preset).can_export):
            return out
        cache = ArtifactCache(cache_dir)
        todo = []
        for job in self.jobs:
            key = cache_key(job)
            if cache.settled(key):
                continue
            try:
                assert job.invocation is not None
                prepared = flat_module(job.case, job.invocation)
            except Exception:
                continue   # its job says what is wrong
            outputs = count_outputs(prepared.out_structure)
            if outputs:
                todo.append((job, key, Piece(prepared.module, tuple(prepared.fresh_inputs()), outputs)))
        _compile(todo, backend, self.preset, cache, out)
        return out

    def failed(self, status: Verdict, error_class: str | None, message: str) -> Compiled:
        return Compiled(self.key, status=status, error_message=message)


def _compile(todo: list, backend: Any, preset: Preset, cache: Any, out: Compiled) -> None:
    """Compile `todo` in one call; when the call fails, the others again without the
    pieces the backend names (PiecesFailed), or else each half the same way, down to tests
    that stand alone (left to their jobs)."""
    stack = [todo]
    while stack:
        part = stack.pop()
        if len(part) < 2:
            continue
        with cache.scratch() as tmp:
            t0 = time.perf_counter()
            out.calls += 1
            try:
                import torch

                with torch.no_grad():
                    artifacts = backend.export_batch([piece for _, _, piece in part], preset, Path(tmp))
                if len(artifacts) != len(part):
                    raise RuntimeError(f"export_batch gave {len(artifacts)} artifacts for {len(part)} pieces")
            except PiecesFailed as exc:
                out.export_ms += (time.perf_counter() - t0) * 1e3
                at_fault = {i for i in exc.pieces if 0 <= i < len(part)}
                rest = [item for i, item in enumerate(part) if i not in at_fault]
                if at_fault and rest:   # the others again, without the pieces at fault
                    stack.append(rest)
                else:
                    stack.extend(_halves(part))
                continue
            except Exception:
                out.export_ms += (time.perf_counter() - t0) * 1e3
                stack.extend(_halves(part))
                continue
            spent = (time.perf_counter() - t0) * 1e3
            out.export_ms += spent
            for (job, key, _), artifact in zip(part, artifacts):
                if artifact is not None and _publish(cache, key, job, artifact, spent / len(part), len(part)):
                    out.batches[job.key] = len(part)


def _halves(part: list) -> list[list]:
    half = len(part) // 2
    return [part[half:], part[:half]]


def _publish(cache: Any, key: str, job: Job, artifact: Artifact, export_ms: float, size: int) -> bool:
    """Move a piece's artifact into the cache under its job's key, with its share of the
    batch's export time; False when it cannot be cached (its job exports it alone)."""
    if artifact.path is None:
        return False
    source = Path(artifact.path)

    def move(work: Path) -> Artifact:
        for item in source.iterdir():
            shutil.move(str(item), str(work / item.name))
        return Artifact(path=work)

    try:
        cache.store(key, move, {"test": job.case.id, "seed": job.seed, "preset": job.preset.name,
                                "batch": size}, export_ms=export_ms)
    except Exception:
        return False
    return True


def job_bytes(job: Job) -> int:
    """The bytes of a job's weights and tensor inputs: what batching it costs in memory."""
    import torch

    invocation = job.invocation
    if invocation is None:
        return 0
    total = sum(t.numel() * t.element_size() for side in invocation.states.values() for t in side.values())
    for value in [*invocation.args, *invocation.kwargs.values()]:
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
    return total


def plan_batches(jobs: Sequence[Job], size: int, look: bool = True) -> list[CompileBatch]:
    """The batches to compile `jobs` in: by preset, in order, at most `size` tests and
    BATCH_BYTES each; jobs whose preset does not batch, that use no cache, or that hold
    more than ALONE_BYTES, whose artifact (or failure) is cached already, or whose test
    failed on the preset before, with any library versions, are left out (their jobs load
    it, or export alone). `look` False: this process cannot tell what is cached, since the
    workers run other library versions (their cache keys differ); each CompileBatch then
    leaves out what its worker finds cached. Sized tests (dynamic shapes) are left out too:
    their export is their own; so are jobs marked `alone` (a test expected to fail)."""
    from ..backends.registry import backend_for
    from .cache import ArtifactCache, cache_key

    if size < 2:
        return []
    open_: dict[tuple[str, str], tuple[list[Job], int]] = {}
    batches: list[CompileBatch] = []
    batching: dict[str, bool] = {}
    caches: dict[str, Any] = {}

    def close(group: tuple[str, str]) -> None:
        members, _ = open_.pop(group)
        if len(members) >= 2:
            batches.append(CompileBatch(f"batch\0{len(batches)}", members[0].preset, members,
                                        members[0].cache_dir or ""))

    for job in jobs:
        if job.cache_dir is None or job.invocation is None or job.case.dynamic is not None or job.alone:
            continue   # a sized test's export leaves dims dynamic: it is never one piece of a batch
        name = job.preset.name
        if name not in batching:
            batching[name] = backend_for(job.preset).batches(job.preset)
        weight = job_bytes(job) if batching[name] else 0
        if not batching[name] or weight > ALONE_BYTES:
            continue
        cache = caches.setdefault(str(job.cache_dir), ArtifactCache(job.cache_dir))
        if cache.failed_before(job):
            continue
        if look and cache.settled(cache_key(job)):
            continue
        group = (name, str(job.cache_dir))
        members, held = open_.get(group, ([], 0))
        if members and (len(members) >= size or held + weight > BATCH_BYTES):
            close(group)
            members, held = [], 0
        members.append(job)
        open_[group] = (members, held + weight)
    for group in list(open_):
        close(group)
    return batches


@dataclass
class Ahead:
    """What compiling ahead did: tests compiled, in how many batches and exporter calls."""

    tests: int = 0
    batches: int = 0
    calls: int = 0
    export_ms: float = 0.0
    lost: list[str] = field(default_factory=list)   # why a batch task itself failed (its tests run alone)


def compile_ahead(pool: Any, jobs: Sequence[Job], size: int,
                  announce: Callable[[list[CompileBatch]], None] | None = None) -> Ahead:
    """Compile `jobs` in batches of up to `size` through `pool` before they run (`announce`
    is told the batches first); each job whose artifact a batch made is marked with its
    batch's size (`Job.batched`). Workers under another interpreter (`pool.python`) have
    cache keys of their own, so they alone decide what is cached."""
    by_key = {job.key: job for job in jobs}
    batches = plan_batches(jobs, size, look=pool.python is None)
    if batches and announce is not None:
        announce(batches)
    done = Ahead(batches=len(batches))
    for compiled in pool.run(batches):
        if compiled.status is not None:
            done.lost.append(f"{compiled.status.value}: {compiled.error_message or ''}".strip())
        done.calls += compiled.calls
        done.export_ms += compiled.export_ms
        for key, n in compiled.batches.items():
            if key in by_key:
                by_key[key].batched = n
                done.tests += 1
    return done


def rerun_alone(job: Job, batch: int | None, status: Verdict | None) -> bool:
    """Whether a job's result must come from a run alone instead: it did not PASS (`status`
    is the judged verdict) on an artifact a batch made, whether the worker said so
    (`batch`), this run compiled it (`Job.batched`), or the worker crashed or hung before
    it could say and the cache holds the batch's artifact."""
    from .cache import ArtifactCache, cache_key

    if status is Verdict.PASS or job.alone:
        return False
    if batch or job.batched:
        return True
    if status in (Verdict.CRASH, Verdict.TIMEOUT) and job.cache_dir is not None and job.invocation is not None:
        try:
            return ArtifactCache(job.cache_dir).made_by_batch(cache_key(job))
        except Exception:
            return False
    return False
