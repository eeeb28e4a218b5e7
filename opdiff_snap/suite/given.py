"""The suites a command reads: the files named, or every suite under the project's suites
folder; a command that finds none has nothing to do, and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..core.errors import OpdiffError
from .discover import suite_paths
from .load import load_suites
from .model import TestCase
from .reader import SuiteReader


def given_suites(paths: Sequence[Path] | None, default_dir: Path, reader: SuiteReader | None = None) -> list[Path]:
    """suite_paths(paths, default_dir), refused when that finds no suite."""
    found = suite_paths(paths, default_dir, reader)
    if not found:
        raise OpdiffError(f"no suites given and none under {default_dir}.")
    return found


def given_cases(paths: Sequence[Path] | None, default_dir: Path) -> list[TestCase]:
    """The test cases of given_suites(paths, default_dir), each file read once."""
    reader = SuiteReader()
    return load_suites(given_suites(paths, default_dir, reader), reader=reader)
