"""Test cases rebuilt from goldens alone, under the rules that keep a golden data.

A golden's stored definition says what to import when the test is built in a worker.
`GoldenCases.case` rebuilds the test from it only when that is safe (suite/trust.py):
the definition names nothing but ATen ops and allowlisted torch.nn classes, or the user
said `--trust-goldens` (then `imported` lists what they allowed). Otherwise the test is
taken from the suite the golden was recorded from, when that suite is on disk and
defines it: the user's own code, and the planner reports STALE if it changed since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import OpdiffError
from ..suite import case_from_definition, load_suites
from ..suite.model import TestCase
from ..suite.trust import untrusted_paths


class UntrustedGolden(OpdiffError):
    """A golden whose definition names code no suite vouches for."""

    def __init__(self, found: list[tuple[str, int, list[str]]]):
        self.found = found
        shown = "; ".join(f"'{tid}' seed {seed}: {', '.join(paths)}" for tid, seed, paths in found[:5])
        more = f" (and {len(found) - 5} more goldens)" if len(found) > 5 else ""
        super().__init__(
            f"{len(found)} golden{'s name' if len(found) != 1 else ' names'} code that is neither an ATen op nor "
            f"an allowlisted torch.nn class: {shown}{more}. A golden store is data and is not run as "
            "code: give the suites these goldens were recorded from (--suites DIR, or run where their "
            "recorded suite paths exist), narrow the selection with --test-ids, or pass --trust-goldens "
            "if you trust whoever wrote this store (it imports exactly those paths, in workers).")


class GoldenCases:
    """Rebuild TestCases from stored definitions (see the module docstring)."""

    def __init__(self, trust: bool = False):
        self.trust = trust
        self.imported: dict[str, None] = {}          # paths allowed by --trust-goldens, in order
        self._suites: dict[str, dict[str, TestCase] | None] = {}

    def case(self, test_id: str, seed: int, definition: dict[str, Any], suite: str) -> TestCase:
        """The test of one golden; raises UntrustedGolden or OpdiffError (malformed)."""
        untrusted = untrusted_paths(definition)
        if untrusted:
            on_disk = self._suite_case(suite, test_id)
            if on_disk is not None:   # the user's own suite defines it: STALE if it changed since
                return on_disk
            if not self.trust:
                raise UntrustedGolden([(test_id, seed, untrusted)])
            self.imported.update(dict.fromkeys(untrusted))
        return case_from_definition(test_id, definition, Path(suite))

    def _suite_case(self, suite: str, test_id: str) -> TestCase | None:
        """The test as the golden's recorded suite defines it on disk now, if that loads."""
        if suite not in self._suites:
            path = Path(suite)
            cases = None
            if path.is_file():
                try:
                    cases = {c.id: c for c in load_suites([path])}
                except OpdiffError:
                    cases = None
            self._suites[suite] = cases
        cases = self._suites[suite]
        return cases.get(test_id) if cases is not None else None
