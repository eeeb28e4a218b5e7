"""What runs on each node of a Ray cluster for the Ray executor (ray_pool.py): the
`NodeWorker` actor, one per busy slot of a node, per preset family. It owns a one-worker
WorkerPool, so the job runs in a persistent subprocess that keeps torch and the family's
runtime imported; a segfault takes only that subprocess (CRASH with the signal), and a job
past the timeout is TIMEOUT and the subprocess is replaced. The actor never unpickles a
task: user code runs in the subprocess only.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from ..core.verdicts import Verdict
from .pool import WorkerPool


@dataclass
class NodeFailure:
    """A task's failure as the node saw it; the parent turns it into `task.failed(...)`."""

    status: str
    error_class: str | None
    message: str
    worker_pid: int | None = None


class Opaque:
    """A pickled task that the actor forwards without unpickling it: pickling this yields
    the original bytes' task again, so it is unpickled in the worker subprocess only."""

    def __init__(self, key: str, data: bytes):
        self.key, self.data = key, data

    def __reduce__(self):
        return (pickle.loads, (self.data,))

    def failed(self, status: Verdict, error_class: str | None, message: str) -> NodeFailure:
        return NodeFailure(status.value, error_class, message)


def node_cache(cache: str | None) -> Path | None:
    """The artifact cache on this node: the parent's when it can be used here (the same
    machine, a shared mount, a remote store), else one of this node's own."""
    if not cache:
        return None
    from .cache import cache_unusable

    path = Path(cache)
    if not cache_unusable(path):
        return path
    return Path.home() / ".cache" / "opdiff-snap" / "artifacts"


class NodeWorker:
    """A Ray actor that runs tasks, one at a time, in one isolated worker subprocess."""

    def __init__(self, timeout_s: float, slots: int, cache: str | None, warm: tuple = (), threads: int = 1):
        self.pool = WorkerPool(jobs=1, timeout_s=timeout_s, threads=threads, cache_dir=node_cache(cache),
                               raw=True)
        self.pool.prestart(warm)

    def run(self, key: str, data: bytes) -> tuple:
        """("ok", the worker's pickled result) or ("failed", status, error class, message, pid)."""
        (result,) = list(self.pool.run([Opaque(key, data)]))  # type: ignore[list-item]  # forwarded as is
        if isinstance(result, NodeFailure):
            return ("failed", result.status, result.error_class, result.message, result.worker_pid)
        return ("ok", result)

    def stop(self) -> None:
        self.pool.close()
