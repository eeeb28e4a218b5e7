"""Finding the processes a test provoked: each is a `sleep` with an argument no other
process on the machine has, looked for in /proc."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Iterable


def unique_sleep() -> str:
    """A `sleep` argument no other process on the machine has (about 16 minutes)."""
    return f"987.{uuid.uuid4().int % 10**9:09d}"


def with_argument(arg: str) -> list[int]:
    """Live processes whose command line holds `arg` (a zombie's is empty)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if arg.encode() in (d / "cmdline").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except OSError:
            pass
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def gone_within(arg: str, pids: list[int], seconds: float = 10.0) -> tuple[list[int], list[int]]:
    """(processes with `arg`, processes among `pids`) still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = with_argument(arg), [p for p in pids if alive(p)]
        if not any(left) or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def is_worker(pid: int) -> bool:
    """Whether `pid` is (still) a worker process started through multiprocessing."""
    try:
        return b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def kill_leftovers(arg: str, workers: Iterable[int] = ()) -> None:
    """Whatever a failing test left behind, so that it does not linger on the machine: the
    processes with `arg`, and those of `workers` that are still worker processes."""
    for pid in [*with_argument(arg), *(w for w in workers if is_worker(w))]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
