"""Persistent, isolated worker processes with a per-job timeout: the parent's side.

The parent starts workers (worker.py; under another interpreter through interpreter.py)
and hands a job to a worker as soon as that worker says it is ready (workers start in
parallel; nobody waits for all of them), and waits on all worker connections at once:

- a result arrives: yield it, hand the worker the next job;
- the pipe reports EOF (the process died): CRASH naming the signal or exit code, start a
  replacement;
- the job's deadline passes: SIGKILL the worker and its process group, TIMEOUT, start a
  replacement.

Every submitted task yields exactly one result, in completion order: its own, or the one
its `failed` builds (see job.Task). Messages are pickled once with the standard pickler
(tensors by value, no shared-memory handles that a killed worker could leave dangling).

Workers may run under another interpreter (`python=`, see interpreter.py); the parent
plans, compares and writes history as always, and the run's meta line takes the workers'
environment (their hello).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Iterable, Iterator, Sequence

from ..core.config import memory_text, usable_memory
from ..core.verdicts import Verdict
from .interpreter import (
    HELLO,
    WORKER_PROTOCOL,
    WorkerEnvironmentError,
    died_before_hello,
    hello_refusal,
    launch,
    resolve,
)
from .job import Task, WorkerContext
from .worker import STOP, serve, stamp

if TYPE_CHECKING:
    from .warmup import WarmUp

STARTUP_TIMEOUT_S = 120.0   # a worker that cannot import torch in this long is broken
MAX_START_FAILURES = 3      # consecutive workers dying before ready: give up on the jobs
STOP_BUSY_S = 1.0          # a busy worker asked to stop (SIGTERM) has this long before it is killed


def kill_group(proc: Any) -> None:
    """SIGKILL a worker and its process group (everything its jobs started). Call it before
    the worker is reaped (joined or polled): until then its process id cannot be reused, so
    the group id names no one else's group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        pass   # not a group leader yet (it has not reached serve), already gone, or no killpg here
    if proc.is_alive():
        proc.kill()


MEMORY_POLL_S = 0.5
MEMORY_CHECKS = sys.platform.startswith("linux")   # resident memory read from /proc


def resident_bytes(pid: int) -> int:
    """Resident memory of process `pid` (0 when it cannot be read: gone, or not Linux)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def default_worker_memory(workers: int) -> int:
    """Three quarters of the memory this process may use (the machine's, or its cgroup's if
    lower), shared by `workers`, and never under 1 GiB: enough for any model a machine can
    hold once per worker, and short of taking the machine down."""
    return max(2**30, usable_memory() * 3 // 4 // max(1, workers))


def wait_exit(proc: Any, timeout: float) -> None:
    """Wait up to `timeout` s for `proc` to exit, leaving it unreaped where the platform
    allows (os.waitid with WNOWAIT), so that kill_group can still name its group."""
    if not hasattr(os, "waitid"):
        proc.join(timeout)
        return
    end = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:
            return   # already reaped
        if time.monotonic() >= end:
            return
        time.sleep(0.02)


def _unpickled(msg: bytes, w: Any) -> Any:
    """The worker's outcome; one this process cannot read back (an output torch pickles
    but cannot load, say) is the job's INFER_FAIL, never the run's end."""
    try:
        return pickle.loads(msg)
    except Exception as exc:
        return stamp(w.job.failed(Verdict.INFER_FAIL, "UnreadableResult",
                                  f"the worker's result cannot be read back ({type(exc).__name__}: {exc}); "
                                  "the outputs hold something torch cannot send between processes"), w.proc.pid)


class UnsendableJob(Exception):
    def __init__(self, job: Task, cause: BaseException):
        super().__init__(str(cause))
        self.job, self.cause = job, cause


@dataclass
class _Worker:
    proc: Any   # a multiprocessing Process, or a ForeignProcess under another interpreter
    conn: Any      # the parent's end of the worker's pipe
    started: float
    ready: bool = False
    job: Task | None = None
    deadline: float = 0.0
    sent_at: float = 0.0
    served: int = 0
    log: Path | None = None
    hello: dict | None = None     # what it said when it became ready


@dataclass
class _Feed:
    """The jobs of one isolated run: the source, those pulled and not yet sent, and how many
    workers in a row failed to start."""

    source: Iterator[Task]
    queue: deque[Task] = field(default_factory=deque)
    exhausted: bool = False
    start_failures: int = 0


def log_tail(path: Path | None, lines: int = 15, chars: int = 1500) -> str:
    """The end of a worker's log: what a native crash printed before it died."""
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16384))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])[-chars:]


def death_description(exitcode: int | None) -> tuple[str, str]:
    """(error_class, message) for a worker that exited with `exitcode`."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        desc = signal.strsignal(-exitcode) or name
        return f"signal {name}", f"the worker process died from {name} ({desc}) while running the job"
    return f"exit code {exitcode}", f"the worker process exited with code {exitcode} while running the job"


class WorkerPool:
    """Run jobs in `jobs` persistent worker processes (or in this process).

    `threads`: intra-op threads per worker (default 1: the same whatever `jobs` and the machine).
    `cache_dir`: where this machine keeps the artifact cache, for jobs that use one
    (default: where each job says). `raw`: yield each worker's result as the pickled
    bytes it sent, undecoded (a pool that only forwards results, execution/ray_pool.py).
    `python`: run the workers under another interpreter (None: this one)."""

    def __init__(self, jobs: int | None = None, timeout_s: float = 300, in_process: bool = False,
                 threads: int | None = None, cache_dir: Path | None = None, raw: bool = False,
                 python: str | os.PathLike | None = None, memory_limit: int | None = None):
        self.n = max(1, int(jobs or os.cpu_count() or 1))
        self.timeout_s = float(timeout_s)
        # resident bytes a worker may hold while it runs a job (see resident_bytes)
        self.memory_limit = memory_limit if memory_limit is not None else default_worker_memory(self.n)
        self.in_process = in_process
        self.cache_dir, self.raw = cache_dir, raw
        if python is not None and in_process:
            raise WorkerEnvironmentError("--in-process runs jobs in this interpreter, --python in another "
                                         "one; give one of them.")
        # workers under another interpreter (None: this one, through multiprocessing's spawn)
        self.python: Path | None = resolve(python) if python is not None else None
        self.refusal: dict | None = None   # the last hello that refused to serve (foreign workers)
        if in_process:
            import torch
            self.threads = torch.get_num_threads()   # intra-op threads the jobs run with
        else:
            self.threads = threads or 1
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._logs: tempfile.TemporaryDirectory | None = None
        self.started_workers = 0   # how many processes were spawned (replacements included)
        self.warm: tuple[WarmUp, ...] = ()   # what each new worker warms up before its hello

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spawn(self) -> _Worker:
        if self._logs is None:
            self._logs = tempfile.TemporaryDirectory(prefix="opdiff-workers-")
        log = Path(self._logs.name) / f"worker-{self.started_workers}.log"
        parent, child = self._ctx.Pipe(duplex=True)
        proc: Any
        if self.python is not None:
            proc = launch(self.python, child, self.threads, log)
        else:
            proc = self._ctx.Process(target=serve,
                                     args=(child, self.threads, str(log), str(self.cache_dir or "") or None,
                                           self.warm),
                                     name="opdiff-worker", daemon=True)
            proc.start()
        child.close()  # so that the parent sees EOF when the worker dies
        self.started_workers += 1
        w = _Worker(proc, parent, time.monotonic(), log=log)
        self._workers.append(w)
        return w

    def _discard(self, w: _Worker, kill: bool) -> None:
        if w in self._workers:
            self._workers.remove(w)
        if kill:
            kill_group(w.proc)
        w.proc.join(timeout=5)
        try:
            w.conn.close()
        except OSError:
            pass

    def prestart(self, warm: Sequence[WarmUp] = (), jobs: int | None = None) -> None:
        """Start the workers now, so they import torch and warm up the `warm` presets'
        backends (warmup.py; replacements too) before the first job comes: as many as
        `jobs` jobs can keep busy, up to the pool's size (None: the pool's size). A worker
        costs a torch import; a check of one test has no use for a second one."""
        self.warm = tuple(warm)
        wanted = self.n if jobs is None else min(self.n, max(0, jobs))
        if not self.in_process:
            while len(self._workers) < wanted:
                self._spawn()

    def close(self) -> None:
        """Stop every worker: kill one still starting; ask an idle one to stop and give it
        2 s; stop a busy one with SIGTERM (it leaves its job and exits normally) and give it
        STOP_BUSY_S; then kill whoever is still there, and every worker's process group
        (what its jobs started) in any case."""
        workers, self._workers = list(self._workers), []
        for w in workers:
            try:
                if w.job is None:
                    w.conn.send_bytes(STOP)
                else:
                    w.proc.terminate()
            except (OSError, ProcessLookupError):
                pass
        now = time.monotonic()
        for w in workers:   # one still starting holds nothing: it goes at once
            end = now + (0.0 if not w.ready else 2.0 if w.job is None else STOP_BUSY_S)
            wait_exit(w.proc, max(0.0, end - time.monotonic()))
            self._discard(w, kill=True)
        if self._logs is not None:
            self._logs.cleanup()
            self._logs = None

    def describe(self) -> dict[str, Any]:
        """What a run's settings add about where it ran: nothing beyond this machine."""
        return {}

    def unavailable(self, preset) -> str | None:
        """Why this machine cannot export `preset` (None: it can); whether it can run what it
        exported, each job finds out."""
        from ..backends.registry import availability

        return availability(preset).export_refusal()

    # ------------------------------------------------------------ the workers' environment
    def environment(self) -> dict:
        """The environment jobs run in, for the run's meta line: this process's, or, for
        workers under another interpreter, what the first worker said in its hello (that
        worker is started now and then serves jobs). Raises WorkerEnvironmentError, naming the
        interpreter and what to install, when no worker can start there."""
        if self.python is None:
            from ..core.environment import environment

            return environment(threads=self.threads)
        ready = [w for w in self._workers if w.ready and w.hello]
        if ready:
            return (ready[0].hello or {})["env"]
        w = self._workers[0] if self._workers else self._spawn()
        deadline = w.started + STARTUP_TIMEOUT_S
        while not w.ready:
            left = deadline - time.monotonic()
            if left <= 0 or not w.conn.poll(left):
                self._discard(w, kill=True)
                raise WorkerEnvironmentError(
                    f"the worker under {self.python} did not start within {STARTUP_TIMEOUT_S:g} s"
                    + _quoted(log_tail(w.log)) + "; nothing was run.")
            try:
                self._greet(w, w.conn.recv_bytes())
            except (EOFError, OSError):
                self._discard(w, kill=True)
                raise died_before_hello(self.python, w.proc.exitcode, log_tail(w.log)) from None
            if not w.ready:
                self._discard(w, kill=True)
                raise hello_refusal(self.python, self.refusal or {})
        return (w.hello or {})["env"]

    def _greet(self, w: _Worker, msg: bytes) -> None:
        """A worker's first message: ready when its hello speaks our protocol; otherwise keep
        the refusal (environment() raises it, the run loop counts a failed start)."""
        hello: dict = {}
        if msg.startswith(HELLO):
            try:
                hello = json.loads(msg[len(HELLO):].decode("utf-8"))
            except ValueError:
                hello = {}
        if hello.get("protocol") == WORKER_PROTOCOL and not hello.get("error"):
            w.ready, w.hello = True, hello
        else:
            self.refusal = hello or {"error": "garbled", "message": repr(msg[:80])}

    # ------------------------------------------------------------ running
    def run(self, jobs: Iterable[Task]) -> Generator[Any, None, None]:
        """Each task's result (see job.Task), in completion order."""
        if self.in_process:
            yield from self._run_in_process(jobs)
        else:
            yield from self._run_isolated(jobs)

    def _run_in_process(self, jobs: Iterable[Task]) -> Iterator:
        context = WorkerContext(threads=self.threads)
        for job in jobs:
            yield stamp(job.run(context))

    def _run_isolated(self, jobs: Iterable[Task]) -> Iterator:
        feed = _Feed(iter(jobs))
        try:
            while True:
                yield from self._dispatch(feed)
                any_busy = any(w.job is not None for w in self._workers)
                if not feed.queue and feed.exhausted and not any_busy:
                    return
                if feed.start_failures >= MAX_START_FAILURES and not any_busy:
                    yield from self._give_up(feed.queue, feed.source)
                    return
                now = time.monotonic()
                deadlines = [w.deadline for w in self._workers if w.job is not None]
                deadlines += [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
                if any_busy and MEMORY_CHECKS:   # look at the busy workers' memory this often
                    deadlines.append(now + MEMORY_POLL_S)
                yield from self._receive(feed, max(0.0, min(deadlines) - now) if deadlines else None)
                yield from self._sweep(feed)
        except GeneratorExit:
            # The consumer stopped early: jobs in flight are abandoned with their workers.
            for w in [w for w in self._workers if w.job is not None]:
                self._discard(w, kill=True)
            raise
        except BaseException:
            self.close()
            raise

    def _dispatch(self, feed: _Feed) -> Iterator:
        """Pull jobs lazily, only as many as there are workers to take them; start the workers
        they need and hand each ready one a job (one that cannot be sent fails here)."""
        busy = sum(1 for w in self._workers if w.job is not None)
        while not feed.exhausted and len(feed.queue) + busy < self.n:
            try:
                feed.queue.append(next(feed.source))
            except StopIteration:
                feed.exhausted = True
        idle = [w for w in self._workers if w.job is None]
        for _ in range(min(len(feed.queue) - len(idle), self.n - len(self._workers))):
            idle.append(self._spawn())
        for w in idle:
            if w.ready and feed.queue:
                job = feed.queue.popleft()
                try:
                    sent = self._send(w, job)
                except UnsendableJob as exc:
                    yield job.failed(Verdict.EXPORT_FAIL, type(exc.cause).__name__,
                                     f"the job could not be sent to a worker: {exc.cause}")
                    continue
                if not sent:
                    feed.queue.appendleft(job)  # it never reached the worker: not its fault

    def _receive(self, feed: _Feed, timeout: float | None) -> Iterator:
        """What the workers send within `timeout`: results, hellos, and deaths (EOF)."""
        for conn in wait([w.conn for w in self._workers], timeout):
            w = next(x for x in self._workers if x.conn is conn)
            try:
                msg = w.conn.recv_bytes()
            except (EOFError, OSError):
                if not w.ready:
                    feed.start_failures += 1
                outcome = self._died(w)
                if outcome is not None:
                    yield outcome
                continue
            if not w.ready:
                self._greet(w, msg)
                if w.ready:
                    feed.start_failures = 0
                else:
                    feed.start_failures += 1
                    self._discard(w, kill=True)
                continue
            outcome = msg if self.raw else _unpickled(msg, w)
            w.job, w.served = None, w.served + 1
            yield outcome

    def _sweep(self, feed: _Feed) -> Iterator:
        """Workers past their job's deadline or their start-up time, or over the memory
        limit: killed and replaced, their jobs failed."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.job is not None and now >= w.deadline and not w.conn.poll():
                # (a result already waiting in the pipe is read on the next turn: the
                # consumer, not the worker, took the time)
                job = w.job
                self._discard(w, kill=True)
                yield stamp(job.failed(Verdict.TIMEOUT, "Timeout",
                                       f"no result after {self.timeout_s:g} s; the worker "
                                       f"(pid {w.proc.pid}) was killed and replaced"), w.proc.pid)
            elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                feed.start_failures += 1
                self._discard(w, kill=True)
            elif w.job is not None and not w.conn.poll() and \
                    resident_bytes(w.proc.pid) > self.memory_limit:
                job, held = w.job, resident_bytes(w.proc.pid)
                self._discard(w, kill=True)
                yield stamp(job.failed(Verdict.CRASH, "MemoryLimit",
                                       f"the worker (pid {w.proc.pid}) held {held / 2**20:.0f} MiB, more "
                                       f"than its limit of {memory_text(self.memory_limit)} "
                                       "(worker-memory-limit in [tool.opdiff]); it was killed and "
                                       "replaced"), w.proc.pid)

    def _send(self, w: _Worker, job: Task) -> bool:
        """Hand `job` to a ready worker; False (worker discarded) if its pipe is broken."""
        try:
            data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # e.g. an unpicklable value in a test's inputs
            raise UnsendableJob(job, exc) from exc
        try:
            w.conn.send_bytes(data)
        except OSError:
            self._discard(w, kill=True)
            return False
        w.job = job
        w.sent_at = time.monotonic()
        w.deadline = w.sent_at + self.timeout_s
        return True

    def _died(self, w: _Worker):
        job = w.job
        self._discard(w, kill=True)
        if job is None:
            return None
        error_class, message = death_description(w.proc.exitcode)
        last = log_tail(w.log)
        return stamp(job.failed(Verdict.CRASH, error_class,
                                f"{message} (pid {w.proc.pid}); the worker was replaced"
                                + (f". Its last output:\n{last}" if last else "")), w.proc.pid)

    def _give_up(self, queue: deque[Task], source: Iterator[Task]) -> Iterator:
        msg = (f"{MAX_START_FAILURES} worker processes in a row died before they were ready"
               + (f" ({hello_refusal(self.python, self.refusal)})" if self.python and self.refusal else "")
               + "; run with --in-process to see the error")
        for job in [*queue, *source]:
            yield job.failed(Verdict.CRASH, "WorkerStartFailed", msg)
        queue.clear()


def _quoted(text: str) -> str:
    return f"; its last output:\n{text}\n" if text else ""
