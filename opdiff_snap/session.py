"""What every command that runs jobs shares around its own logic: the worker pool it runs
jobs in, the settings its history records, and telling the caller's listener things."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from .config import Settings, parse_executor
from .errors import OpdiffError
from .execution import WorkerPool
from .results import Listener


def make_pool(settings: Settings, in_process: bool, listener: Listener | None = None,
              python: Path | None = None):
    """The pool the run's jobs go to: worker processes here (under this interpreter, or
    `python`), this process, or a Ray cluster (`settings.executor`, execution/ray_pool.py),
    which tells the listener of nodes lost on the way. Each runs tasks with the same contract."""
    kind, address = parse_executor(settings.executor)
    if kind == "local":
        return WorkerPool(jobs=settings.jobs, timeout_s=settings.timeout_s, in_process=in_process, python=python)
    if in_process or python is not None:
        flag = "--in-process runs jobs in this process" if in_process else "--python runs workers here"
        raise OpdiffError(f"{flag}, --executor {settings.executor} on a Ray cluster's own interpreters; "
                          "give one of them.")
    from .execution.ray_pool import RayPool

    return RayPool(address, jobs=settings.jobs, timeout_s=settings.timeout_s,
                   notify=lambda text: notice(listener, text))


def settings_json(settings: Settings, in_process: bool, cache: bool, pool) -> dict[str, Any]:
    out = {"jobs": settings.jobs, "repeats": settings.repeats, "warmup": settings.warmup,
           "timeout_s": settings.timeout_s, "in_process": in_process, "cache": cache,
           "threads": pool.threads}
    if pool.python:
        out["python"] = str(pool.python)
    describe = getattr(pool, "describe", None)   # where a Ray run ran: its executor and nodes
    if callable(describe):
        out.update(describe())
    return out


def notice(listener: Listener | None, text: str) -> None:
    """Tell the user something before the results come (listeners with a `notice` method)."""
    say = getattr(listener, "notice", None)
    if callable(say):
        say(text)


def warn(listener: Listener | None, text: str) -> None:
    """A warning for the user (listeners with a `warn` method; Python's warnings otherwise)."""
    say = getattr(listener, "warn", None)
    if callable(say):
        say(text)
    else:
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def set_total(listener: Listener | None, total: int) -> None:
    """Tell the listener how many results to expect (listeners with a `set_total` method)."""
    say = getattr(listener, "set_total", None)
    if callable(say):
        say(total)
