"""YAML suites -> TestCases -> Invocations (load, validate, expand, materialize)."""

from .construct import build_modules, resolve_op
from .discover import discover_suites, suite_paths
from .expand import case_from_definition, load_suites
from .materialize import derive_seed, materialize
from .model import Call, Invocation, TestCase, Tolerance
from .selection import select

__all__ = ["Call", "Invocation", "TestCase", "Tolerance", "build_modules", "case_from_definition",
           "derive_seed", "discover_suites", "load_suites", "materialize", "resolve_op", "select", "suite_paths"]
