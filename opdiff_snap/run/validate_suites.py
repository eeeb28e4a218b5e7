"""`opdiff validate`: suites loaded and validated without running their code, then what
only an import can settle (suite/unsettled.py) imported in the workers of the command's
pool; every problem reported at once, naming the test and the path."""

from __future__ import annotations

from pathlib import Path

from ..core.config import Settings
from ..core.errors import Problem, SuiteError
from ..execution.pools import make_pool
from ..execution.probe import ImportProbe
from ..suite import TestCase
from ..suite.given import given_cases
from ..suite.unsettled import unsettled_paths


def validate(suites=None, *, imports: bool = False, settings: Settings | None = None, in_process: bool = False,
             python: Path | None = None) -> list[TestCase]:
    """The tests of the suites (default: every suite under `settings.suites`), or SuiteError.
    The pool is that of `settings.executor`, its workers under `python` when given."""
    settings = settings or Settings()
    cases = given_cases(suites, settings.suites)
    unsettled = {p.key: p for p in unsettled_paths(cases, imports)}
    problems = []
    if unsettled:
        probes = [ImportProbe(p.path, p.case.suite_dir, p.case.import_dirs, p.module, key=p.key, config=p.config)
                  for p in unsettled.values()]
        with make_pool(settings, in_process, python=python) as pool:
            for result in pool.run(probes):
                if result.problem is not None:
                    p = unsettled[result.key]
                    problems.append(Problem(str(p.case.suite), f"{p.path}: {result.problem}", test_id=p.case.id))
    if problems:
        raise SuiteError(problems)
    return cases
