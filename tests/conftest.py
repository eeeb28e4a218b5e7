"""Hygiene shared by every test file."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def pytest_configure(config):
    """xdist's `--dist loadfile` hands out files in collection order; keep ours (below)
    instead of its own, by number of tests."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    # the key that signs cache entries (core/signing.py) is made here, not in the user's state folder
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="opdiff-test-state-")


def pytest_collection_modifyitems(config, items):
    """Test files longest first (seconds from durations.json; a file not in it counts as
    quick), so that the workers end on short files instead of one waiting on a long one.
    Within a file the order is kept. `python tools/test_durations.py LOG` rewrites it."""
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    root = Path(str(config.rootpath))

    def weight(item) -> float:
        try:
            name = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return 0.0
        value = seconds.get(name, 0.0)
        return float(value) if isinstance(value, (int, float)) else 0.0

    items.sort(key=lambda item: -weight(item))


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
