"""Hygiene shared by every test file."""

from __future__ import annotations

import signal

import pytest


def _deliverable_sigint() -> None:
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:      # not the main thread: nothing here can change the disposition
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture(autouse=True)
def _sigint_left_as_found():
    """A test (or a library it starts in this process) that ignores or blocks SIGINT and does
    not put it back would leave every process later tests start with SIGINT ignored or
    blocked (both are inherited across exec, as a shell ignores it for a background job), and
    Ctrl-C could not reach them. Each test starts with Python's own handler and SIGINT
    unblocked, and leaves the process so."""
    _deliverable_sigint()
    yield
    _deliverable_sigint()
