"""What every command that runs jobs shares around its own logic: the worker pool it runs
jobs in, the settings its history records, and telling the caller's listener things."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..compare.results import Listener
from ..core.config import Settings
from ..execution.pools import Pool, open_pool


def make_pool(settings: Settings, in_process: bool = False, listener: Listener | None = None,
              python: Path | None = None) -> Pool:
    """The pool a command's jobs go to (execution/pools.py: worker processes here, under
    this interpreter or `python`, this process, or a Ray cluster), telling the listener of
    what happens on the way that is no result (a cluster's node lost)."""
    return open_pool(settings, in_process=in_process, python=python, notify=lambda text: notice(listener, text))


def settings_json(settings: Settings, in_process: bool, cache: bool, pool: Pool) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": settings.jobs, "repeats": settings.repeats, "warmup": settings.warmup,
                           "timeout_s": settings.timeout_s, "in_process": in_process, "cache": cache,
                           "threads": pool.threads}
    if pool.python:
        out["python"] = str(pool.python)
    out.update(pool.describe())   # where a Ray run ran: its executor and nodes
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
