"""`opdiff gradcheck`: autograd against central finite differences in float64
(execution/gradients.py) for the selected tests, each in a worker."""

from __future__ import annotations

from pathlib import Path

from ..core.config import Settings
from ..core.errors import OpdiffError
from ..execution.gradients import GradcheckReport, GradcheckTask
from ..execution.pools import make_pool
from ..suite import select
from ..suite.given import given_cases


def gradcheck_tests(suites=None, *, test_ids=None, tags=None, seed: int = 0, eps: float = 1e-6,
                    max_entries: int = 32, settings: Settings | None = None, in_process: bool = False,
                    python: Path | None = None) -> list[GradcheckReport]:
    """The tests with `grad: true` (or every selected test when `test_ids` is given), in
    suite order, checked in the pool of `settings` (executor, jobs, timeout_s), its
    workers under `python` when given."""
    settings = settings or Settings()
    cases = select(given_cases(suites, settings.suites), test_ids, tags)
    if not test_ids:
        cases = [c for c in cases if c.grad]
    if not cases:
        raise OpdiffError("no test to gradcheck: mark tests with `grad: true` or select them with --test-ids.")
    tasks = [GradcheckTask(c, seed, eps, max_entries, key=c.id) for c in cases]
    with make_pool(settings, in_process, python=python) as pool:
        done = {r.test_id: r for r in pool.run(tasks)}
    return [done[c.id] for c in cases]
