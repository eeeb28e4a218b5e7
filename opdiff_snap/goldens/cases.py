"""Test cases rebuilt from goldens alone, under the rules that keep a golden data.

A golden's stored definition says what to run when the test is built in a worker.
`GoldenCases.case` rebuilds the test from it only when that is safe (suite/trust.py):
the definition names nothing but pure ATen ops and allowlisted torch.nn classes, or the
user said `--trust-goldens` (then `imported` lists what they allowed). Otherwise the test
is taken from the suites the user pointed at (`--suites`, `[tool.opdiff] suites`,
`./suites`), when one of them defines it: the user's own code, and the planner reports
STALE if it changed since. Nothing read from a golden chooses what vouches for it: its
`suite` attribute (the path it was recorded from) is never loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..core.errors import OpdiffError
from ..suite import case_from_definition, load_suites
from ..suite.model import TestCase
from ..suite.reader import SuiteReader
from ..suite.trust import described, untrusted_paths


class UntrustedGolden(OpdiffError):
    """A golden whose definition names code no suite vouches for."""

    def __init__(self, found: list[tuple[str, int, list[str]]]):
        self.found = found
        shown = "; ".join(f"'{tid}' seed {seed}: {', '.join(map(described, paths))}"
                          for tid, seed, paths in found[:5])
        more = f" (and {len(found) - 5} more goldens)" if len(found) > 5 else ""
        super().__init__(
            f"{len(found)} golden{'s name' if len(found) != 1 else ' names'} code that is neither a pure ATen op "
            f"nor an allowlisted torch.nn class, and no suite given vouches for it: {shown}{more}. A golden "
            "store is data and is not run as code, and nothing was run: give the suites these goldens were "
            "recorded from (--suites DIR, [tool.opdiff] suites, or ./suites), narrow the selection with "
            "--test-ids, or pass --trust-goldens if you trust whoever wrote this store (it runs exactly "
            "those paths, in workers).")


class GoldenCases:
    """Rebuild TestCases from stored definitions (see the module docstring). `suites`:
    the suite files the user pointed at, the only ones that may vouch for a golden."""

    def __init__(self, trust: bool = False, suites: Sequence[Path] = (), reader: SuiteReader | None = None):
        self.trust = trust
        self.suites = list(suites)
        self.reader = reader   # the command's reads of its suites (each file read once)
        self.imported: dict[str, None] = {}          # paths allowed by --trust-goldens, in order
        self._vouching: dict[str, TestCase] | None = None

    def case(self, test_id: str, seed: int, definition: dict[str, Any], suite: str) -> TestCase:
        """The test of one golden; raises UntrustedGolden, SuiteError (a suite pointed at
        does not load) or OpdiffError (malformed). `suite` is the golden's recorded suite
        path: it only places a rebuilt definition's `file:` paths, never vouches."""
        untrusted = untrusted_paths(definition)
        if untrusted:
            vouched = self.vouching().get(test_id)
            if vouched is not None:   # the user's own suite defines it: STALE if it changed since
                return vouched
            if not self.trust:
                raise UntrustedGolden([(test_id, seed, untrusted)])
            self.imported.update(dict.fromkeys(untrusted))
        return case_from_definition(test_id, definition, Path(suite))

    def vouching(self) -> dict[str, TestCase]:
        """Test id -> test case of the suites pointed at, loaded on first need."""
        if self._vouching is None:
            self._vouching = {c.id: c for c in load_suites(self.suites, reader=self.reader)} if self.suites else {}
        return self._vouching
