"""YAML suites -> TestCases -> Invocations (load, validate, expand, materialize).

The names here need no torch; `construct` (user code) and `materialize` (seeded tensors)
are imported from their modules by the code that runs jobs."""

from .discover import discover_suites, suite_paths
from .expand import case_from_definition
from .load import load_suites
from .model import Call, Invocation, TestCase, Tolerance
from .selection import select

__all__ = ["Call", "Invocation", "TestCase", "Tolerance", "case_from_definition", "discover_suites", "load_suites",
           "select", "suite_paths"]
