"""The worker pool for callers that queue work early and wait for one result at a time.

`WorkerPool.run` yields results in completion order to one consumer. The pytest plugin
has many consumers instead, one per test item, each asking for its own result in turn;
and it knows the work long before each item asks (all of a session's items, or the next
item under xdist). A Dispatcher keeps the pool busy for them: `submit` queues work,
`wait(key)` drives the pool until that key's result is in, keeping every other result
that arrives meanwhile for whoever asks for it later.

Work is queued as a key and a maker: the maker runs when the pool has a free worker
(so goldens are read only as their jobs are about to start), and returns the task to
run, or `Ready(value)` when the result is known without running anything. Results are
whatever the tasks return (or their `failed`), as from WorkerPool.run.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, Iterator

from .job import Task
from .pools import Pool


@dataclass
class Ready:
    """A result known without running anything."""

    value: Any


@dataclass
class _Raised:
    error: BaseException


def _given(work: Task | Ready | Exception) -> Task | Ready:
    if isinstance(work, Exception):
        raise work
    return work


class Dispatcher:
    """Queue work on a WorkerPool now, take each result when it is wanted."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self._queue: deque[tuple[str, Callable[[], Task | Ready]]] = deque()
        self._keys: set[str] = set()      # queued or running, result not yet taken
        self._done: dict[str, Any] = {}
        self._run: Generator[Any, None, None] | None = None

    def submit(self, key: str, make: Callable[[], Task | Ready]) -> None:
        """Queue one piece of work under `key` (the key its task echoes back)."""
        if key in self._keys:
            raise ValueError(f"work '{key}' is already queued")
        self._keys.add(key)
        self._queue.append((key, make))

    def put(self, key: str, work: Task | Ready | Exception) -> None:
        """Queue work made already: a task, a Ready result, or the exception making it raised
        (raised by `wait(key)`, for that key alone)."""
        self.submit(key, functools.partial(_given, work))

    def queued(self, key: str) -> bool:
        return key in self._keys

    @property
    def python(self) -> Any:
        """The interpreter the pool's workers run under (None: this one)."""
        return self.pool.python

    def run(self, tasks: Iterable[Task]) -> Iterator[Any]:
        """Run `tasks` ahead of the work queued after them, yielding their results in their
        order (so a Dispatcher serves where a pool's `run` is asked for)."""
        keys = []
        for task in tasks:
            self.put(task.key, task)
            keys.append(task.key)
        for key in keys:
            yield self.wait(key)

    def wait(self, key: str) -> Any:
        """The result of `key`, running the pool until it is in. A maker that raised
        raises here, for its own key only."""
        if key not in self._keys:
            raise KeyError(f"no work queued under '{key}'")
        while key not in self._done:
            if self._run is None:
                self._run = self.pool.run(self._tasks())
            try:
                result = next(self._run)
            except StopIteration:
                # the queue ran dry while this run had jobs in flight; later work waits
                # for a new run
                self._run = None
                if not self._queue and key not in self._done:
                    raise RuntimeError(f"the pool finished without a result for '{key}'") from None
                continue
            self._done[result.key] = result
        self._keys.discard(key)
        result = self._done.pop(key)
        if isinstance(result, _Raised):
            raise result.error
        return result

    def _tasks(self) -> Iterator[Task]:
        while self._queue:
            key, make = self._queue.popleft()
            try:
                work = make()
            except Exception as exc:  # one item's problem, not the pool's
                self._done[key] = _Raised(exc)
                continue
            if isinstance(work, Ready):
                self._done[key] = work.value
            else:
                yield work

    def close(self) -> None:
        """Abandon what is queued or running (its workers are killed) and stop the pool."""
        if self._run is not None:
            self._run.close()
            self._run = None
        self._queue.clear()
        self._keys.clear()
        self._done.clear()
        self.pool.close()
