"""Where a command's jobs run: the one place that makes a pool. Every command that runs
jobs (record, check, validate, localize, gradcheck, goldens reference, repro's node graph,
the pytest plugin) takes its pool from `open_pool` (`make_pool`: with a listener), so
`--executor`, `--python` and `--in-process` mean the same everywhere, and a combination
that cannot work is refused the same way before anything runs.

- executor "local": worker processes on this machine (pool.py), under this interpreter or
  `python`; or this process itself with `in_process`.
- executor "ray" / "ray://HOST:PORT": a Ray cluster (ray_pool.py), each job on a node with
  what its preset needs; the nodes run their own interpreters.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Protocol, Sequence

from ..core.config import Settings, parse_executor
from ..core.errors import OpdiffError
from .job import Task
from .pool import WorkerPool

if TYPE_CHECKING:
    from ..backends.base import Preset
    from .warmup import WarmUp


class Pool(Protocol):
    """What a command may use of the pool it runs jobs in (WorkerPool, RayPool)."""

    @property
    def n(self) -> int:
        """How many jobs run at once (how wide a bisection probes)."""
    @property
    def in_process(self) -> bool: ...
    @property
    def python(self) -> Path | None:
        """The interpreter the workers run under, when not this one (local workers only)."""
    @property
    def threads(self) -> int | None:
        """Intra-op threads per job (None: each node decides)."""

    def run(self, tasks: Iterable[Task]) -> Generator[Any, None, None]:
        """Each task's result, in completion order (see job.Task)."""

    def prestart(self, warm: Sequence[WarmUp] = (), jobs: int | None = None) -> None:
        """Start the workers now and warm up the backends of `warm`, while the caller plans:
        as many as `jobs` jobs can keep busy (None: all of them). Called again with more
        jobs, it starts the workers those need."""

    def environment(self) -> dict:
        """The environment the jobs run in, for a run's meta line."""

    def describe(self) -> dict[str, Any]:
        """What a run's settings add about where it ran (a cluster: its executor and nodes)."""

    def unavailable(self, preset: Preset) -> str | None:
        """Why no place this pool runs jobs can take `preset`'s jobs (None: one can)."""

    def close(self) -> None: ...

    def __enter__(self) -> Pool: ...

    def __exit__(self, *exc: object) -> None: ...


def open_pool(settings: Settings, *, in_process: bool = False, python: Path | None = None,
              notify: Callable[[str], None] | None = None) -> Pool:
    """The pool for `settings.executor`, with `settings.jobs` workers and `settings.timeout_s`
    per job. `in_process` and `python` are for local workers only: with a Ray executor they
    are refused, naming both flags. Workers under `python` are started now, so an
    interpreter that cannot serve is refused before anything runs. `notify` hears what the
    user should know that is no result (a cluster's node lost on the way)."""
    kind, address = parse_executor(settings.executor)
    if kind == "local":
        pool = WorkerPool(jobs=settings.jobs, timeout_s=settings.timeout_s, in_process=in_process, python=python,
                          threads=settings.threads, memory_limit=settings.worker_memory_limit)
        if python is not None:
            try:
                pool.environment()
            except BaseException:
                pool.close()
                raise
        return pool
    if in_process or python is not None:
        flag = "--in-process runs jobs in this process" if in_process else "--python runs workers here"
        raise OpdiffError(f"{flag}, --executor {settings.executor} on a Ray cluster's own interpreters; "
                          "give one of them.")
    from .ray_pool import RayPool

    return RayPool(address, jobs=settings.jobs, timeout_s=settings.timeout_s, notify=notify, threads=settings.threads)


def make_pool(settings: Settings, in_process: bool = False, listener: object = None,
              python: Path | None = None) -> Pool:
    """`open_pool` for a command that has a listener: what happens on the way that is no
    result (a cluster's node lost) goes to the listener's `notice`, where it has one
    (run/session.py's `RunListener`, or a plain listener that defines it)."""
    notice = getattr(listener, "notice", None)
    return open_pool(settings, in_process=in_process, python=python, notify=notice if callable(notice) else None)


def run_one(task: Task, timeout_s: float = 300.0, in_process: bool = False):
    """One task in a fresh local worker (or here, in-process mode): its result, or what its
    `failed` builds when the worker crashed or timed out."""
    with open_pool(Settings(jobs=1, timeout_s=timeout_s), in_process=in_process) as pool:
        return next(iter(pool.run([task])))
