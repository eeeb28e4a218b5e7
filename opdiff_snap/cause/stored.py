"""The test case and golden a cause command works on, from the golden store."""

from __future__ import annotations

from pathlib import Path

from ..goldens import GoldenStore
from ..goldens.cases import GoldenCases
from ..goldens.golden import Golden
from ..suite import TestCase, suite_paths
from ..suite.reader import SuiteReader


def golden_case(test_id: str, seed: int, goldens: Path | str = Path("goldens"), trust_goldens: bool = False,
                suites: Path | str = Path("suites")) -> tuple[TestCase, Golden]:
    """(TestCase, Golden) of one stored golden: the case rebuilt from the definition the
    golden was recorded from, so it always matches the stored inputs and weights (under
    the trust rules of goldens/cases.py: only the suites under `suites` may vouch for
    code the definition names)."""
    golden = GoldenStore(goldens).read(test_id, seed)
    reader = SuiteReader()
    vouching = GoldenCases(trust_goldens, suite_paths(None, Path(suites), reader), reader)
    case = vouching.case(test_id, seed, golden.definition, golden.suite)
    return case, golden
