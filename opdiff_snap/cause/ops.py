"""`opdiff ops`: which presets lower each ATen op of the selected tests (cause/lowering.py),
each test surveyed in a worker."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..backends.registry import get_preset
from ..core.config import Settings
from ..core.errors import OpdiffError
from ..execution.pools import make_pool
from ..suite import select
from ..suite.given import given_cases
from .lowering import OpRow, OpsTask, TestOps, op_table


def survey_ops(suites=None, *, backends: Sequence[str], test_ids=None, tags=None, seed: int = 0,
               settings: Settings | None = None, in_process: bool = False,
               python: Path | None = None) -> tuple[list[OpRow], list[TestOps]]:
    """(the op table, each test's survey), the tests in suite order. Answers come from the
    op-support cache of `settings.cache` where it has them; a test's ops are lowered alone
    only where its whole graph does not lower."""
    settings = settings or Settings()
    presets = [get_preset(b) for b in backends]
    cases = select(given_cases(suites, settings.suites), test_ids, tags)
    if not cases:
        raise OpdiffError("no test selected: check the suites, --test-ids and --tags.")
    tasks = [OpsTask(c.id, c, presets, settings.cache, seed) for c in cases]
    with make_pool(settings, in_process, python=python) as pool:
        done = {t.test_id: t for t in pool.run(tasks)}
    surveyed = [done[c.id] for c in cases]
    return op_table(surveyed, [p.name for p in presets]), surveyed
