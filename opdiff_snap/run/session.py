"""What every command that runs jobs shares around its own logic: the settings its history
records, and telling the caller's listener things (`RunListener`: what a listener may
hear, with the defaults). The pool the jobs run in is execution/pools.py's `make_pool`."""

from __future__ import annotations

import warnings
from typing import Any

from ..compare.results import Listener, Result
from ..core.config import Settings
from ..execution.pools import Pool


def settings_json(settings: Settings, in_process: bool, cache: bool, pool: Pool) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": settings.jobs, "repeats": settings.repeats, "warmup": settings.warmup,
                           "timeout_s": settings.timeout_s, "in_process": in_process, "cache": cache,
                           "threads": pool.threads, "batch": settings.batch}
    if pool.python:
        out["python"] = str(pool.python)
    out.update(pool.describe())   # where a Ray run ran: its executor and nodes
    return out


class RunListener:
    """What a command tells its caller while it runs, declared in one place. The public API
    takes any callable of a Result as its listener; one that subclasses this class (or
    defines some of these methods itself: `listening`) also hears the rest, and the
    defaults below stand in for what it leaves out."""

    def __call__(self, result: Result) -> None:
        """One result, as soon as it is judged. Default: nothing."""

    def notice(self, text: str) -> None:
        """Something the user should know before the results come (what --trust-goldens
        imports, a cluster's node lost). Default: nothing."""

    def warn(self, text: str) -> None:
        """A warning for the user. Default: Python's warnings (RuntimeWarning), attributed
        to the caller of the function that warns (through `warn` below)."""
        warnings.warn(text, RuntimeWarning, stacklevel=4)

    def set_total(self, total: int) -> None:
        """How many results to expect, once the command knows (for a progress bar's ETA).
        Default: nothing."""


HOOKS = tuple(name for name, member in vars(RunListener).items() if callable(member) and not name.startswith("_"))
"""RunListener's methods beyond the call for each result: what a plain listener may define."""


class _Listening(RunListener):
    """A listener that does not subclass RunListener: its own methods where it defines
    them, RunListener's defaults elsewhere."""

    def __init__(self, target: Listener | None):
        self.target = target
        self.defined = frozenset(name for name in HOOKS if callable(getattr(target, name, None)))

    def __call__(self, result: Result) -> None:
        if self.target is not None:
            self.target(result)

    def notice(self, text: str) -> None:
        if "notice" in self.defined:
            self.target.notice(text)   # type: ignore[union-attr]  # defined: checked above

    def warn(self, text: str) -> None:
        if "warn" in self.defined:
            self.target.warn(text)   # type: ignore[union-attr]
        else:   # RunListener.warn's default, from as deep a frame
            warnings.warn(text, RuntimeWarning, stacklevel=4)

    def set_total(self, total: int) -> None:
        if "set_total" in self.defined:
            self.target.set_total(total)   # type: ignore[union-attr]


def listening(listener: Listener | None) -> RunListener:
    """`listener` (None: nobody) as a RunListener."""
    return listener if isinstance(listener, RunListener) else _Listening(listener)


def notice(listener: Listener | None, text: str) -> None:
    """Tell the user something before the results come (RunListener.notice)."""
    listening(listener).notice(text)


def warn(listener: Listener | None, text: str) -> None:
    """A warning for the user (RunListener.warn: Python's warnings unless the listener
    says it itself)."""
    listening(listener).warn(text)


def set_total(listener: Listener | None, total: int) -> None:
    """Tell the listener how many results to expect (RunListener.set_total)."""
    listening(listener).set_total(total)
