"""A worker process: what runs on the far end of the pool's pipe (pool.py).

Each worker is a spawned process that imports torch and the backends once, warms up the
presets the run needs (warmup.py), says hello and then serves tasks over a Pipe, one at a
time, until the parent says stop or is gone. Its stdout and stderr go to a log of its own;
when a task fails at a stage, what the backend printed meanwhile is appended to the
result's message (job.Explained).

Each worker leads a process group of its own (a new session), and whatever a job starts
(a subprocess, a forked helper) belongs to it: a worker that times out, crashes or is
stopped at the end of the run has its whole group killed, so nothing a job started
outlives the run. A worker whose parent dies (killed with SIGKILL, say) kills its own
group (`serve`'s watchdog), and a worker killed with its parent (Ray ends an actor's
children) has its group killed by the keeper process it started. Only a process that
leaves the group on purpose (setsid, a daemon's double fork) escapes.

A worker's first message is its hello: `b"hello " + JSON` with the worker protocol version
and its environment (environment.environment(): the versions it runs with). A worker under
another interpreter starts through interpreter.BOOTSTRAP, which reaches `serve` as
`opdiff_snap.execution.pool.serve`.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..core.errors import error_text
from ..core.verdicts import STAGE_FAILURES, Verdict
from .interpreter import HELLO, WORKER_PROTOCOL
from .job import Explained, Stamped, Task, WorkerContext

if TYPE_CHECKING:
    from .warmup import WarmUp

STOP = b"stop"              # the parent's last message to an idle worker
WATCHDOG_S = 0.5            # how often a worker looks whether its parent is still there


def hello_message(threads: int) -> bytes:
    """What a worker says before its first job: protocol version, opdiff-snap, environment."""
    import opdiff_snap

    from ..core.environment import environment

    return HELLO + json.dumps({
        "protocol": WORKER_PROTOCOL, "opdiff_snap": opdiff_snap.__version__,
        "location": str(Path(opdiff_snap.__file__).resolve().parent), "executable": sys.executable,
        "env": environment(threads=threads)}, default=str).encode("utf-8")


def serve(conn: Connection, threads: int, log_path: str | None = None,
          cache_dir: str | None = None, warm: Sequence[WarmUp] = ()) -> None:
    """Entry point of a worker process. Its stdout and stderr (exporter chatter, library
    warnings, a native crash's last words) go to `log_path`, never into the run's output;
    the parent quotes the tail of that log when the worker dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when workers stop
    _lead_group()
    signal.signal(signal.SIGTERM, _stop)           # ... and stops a busy one with SIGTERM first
    try:
        _serve(conn, threads, log_path, cache_dir, warm)
    except Stopped:
        pass
    _leave()


def _leave() -> None:
    """Exit as a normal exit would, less the interpreter's teardown of torch and the
    backends' modules (0.4 s of CPU here, which the pool's close would wait for): the exit
    handlers run, multiprocessing's among them, which release what the job's libraries
    registered (tqdm's lock is a named semaphore), and the streams are flushed."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Stopped(BaseException):
    """SIGTERM in a worker: the pool is closing while it runs a job (Ctrl-C, a run stopped
    by an error). The worker leaves the job and exits the normal way, so multiprocessing
    releases what the job's libraries made (tqdm's lock is a named semaphore); killed
    outright, the resource tracker would report it as leaked when opdiff exits."""


def _stop(signum, frame) -> None:
    raise Stopped()


def _serve(conn: Connection, threads: int, log_path: str | None, cache_dir: str | None,
           warm: Sequence[WarmUp] = ()) -> None:
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    import torch
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (cannot happen in a fresh process, but harmless)
    try:
        from ..backends import registry  # noqa: F401  (import once, before the first job)
    except ImportError:
        pass
    if warm:
        from .warmup import warm_up

        warm_up(warm, threads)
    context = WorkerContext(threads=threads, cache_dir=Path(cache_dir) if cache_dir else None)
    conn.send_bytes(hello_message(threads))
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):   # the parent is gone: so is everything this worker started
            _end_own_group()
            return
        if msg == STOP:
            return
        task: Task = pickle.loads(msg)
        log_start = os.path.getsize(log_path) if log_path else 0
        try:
            result = task.run(context)
        except Stopped:
            raise
        except BaseException as exc:  # tasks catch Exception; this is SystemExit & co.
            result = task.failed(Verdict.INFER_FAIL, type(exc).__name__, error_text(exc))
        stamp(result)
        if log_path and isinstance(result, Explained) and result.status in STAGE_FAILURES:
            # runtimes often say why only on stderr (ExecuTorch: "Missing operator: ...")
            said = log_since(Path(log_path), log_start)
            if said:
                result.error_message = f"{result.error_message or ''}\nbackend output:\n{said}"
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps(stamp(task.failed(Verdict.INFER_FAIL, type(exc).__name__,
                                                   f"the result could not be sent back: {error_text(exc)}")))
        conn.send_bytes(data)


# Started by each worker, in its group: when the worker is gone (its parent process id
# changes), kill the group. This covers a worker killed together with its parent, as Ray
# does with an actor's children, when nobody else is left to end what its jobs started.
_KEEPER = """
import os, signal, sys, time
while os.getppid() == int(sys.argv[1]):
    time.sleep(float(sys.argv[2]))
os.killpg(os.getpgrp(), signal.SIGKILL)
"""


def _lead_group() -> None:
    """Make this worker the leader of a process group of its own (a new session; a worker
    under another interpreter already is one). Then watch both ends: a thread here kills
    the group when the worker's parent is gone, and a keeper process in the group kills it
    when the worker itself is gone."""
    if not hasattr(os, "setsid"):
        return   # no process groups here (Windows)
    try:
        os.setsid()
    except OSError:
        pass   # already a session leader (started with start_new_session)
    if os.getpgrp() != os.getpid():
        return
    try:
        subprocess.Popen([sys.executable, "-I", "-S", "-c", _KEEPER, str(os.getpid()), str(WATCHDOG_S)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True)
    except OSError:
        pass   # no keeper (no process to spare): the parent and the watchdog below still end the group
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_S)
        _end_own_group()

    threading.Thread(target=watch, name="opdiff-parent-watch", daemon=True).start()


def _end_own_group() -> None:
    """SIGKILL this worker's process group, when the worker leads it (never its parent's)."""
    if os.getpgrp() == os.getpid():
        sys.stdout.flush()
        sys.stderr.flush()
        os.killpg(os.getpid(), signal.SIGKILL)


def stamp(result: Any, pid: int | None = None) -> Any:
    """Note which worker produced a result (results that record it: job.Stamped)."""
    if isinstance(result, Stamped):
        result.worker_pid = pid if pid is not None else os.getpid()
    return result


def log_since(path: Path, offset: int, lines: int = 8, chars: int = 1000) -> str:
    """What a worker printed since `offset`, minus Python warnings' noise: its last lines."""
    sys.stderr.flush()
    sys.stdout.flush()
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read(65536).decode("utf-8", "replace")
    keep = [ln for ln in text.splitlines()
            if "Warning" not in ln and not ln.startswith("  ")
            and re.search(r"[A-Za-z]{3}", re.sub(r"^\[[^\]]*\]", "", ln))]  # not a dump of numbers
    return "\n".join(keep[-lines:])[-chars:]
