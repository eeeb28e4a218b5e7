"""Core ATen coverage: of torch's Core ATen op set (the overloads torch tags `core`, what
it asks export backends to implement), which the selected tests exercise once exported
and decomposed as backends receive them, and per preset how many of those ran and passed
in the latest check the history holds.

An op counts as *lowered* on a preset when at least one test that exercises it got past
export and load there (its latest verdict is in `verdicts.LOWERED`; off macOS, a CoreML
conversion counts), and as *passed* when at least one such test passed. A test whose
export fails says nothing of its other ops; an op whose tests only converted is
*converted only*, and one no test of the preset's history exercises *not checked*.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..core.config import Settings
from ..core.errors import OpdiffError, error_text
from ..core.verdicts import LOWERED, Verdict
from ..execution.job import WorkerContext
from ..execution.pools import make_pool
from ..storage.local import write_json_whole
from ..suite import select
from ..suite.given import given_cases
from ..suite.model import TestCase


def core_aten_ops() -> list[str]:
    """Every overload of torch's Core ATen op set, as `aten::name.overload`, sorted."""
    out = set()
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        name, _, overload = full[len("aten::"):].partition(".")
        try:
            op = getattr(getattr(torch.ops.aten, name), overload or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.core in op.tags:
            out.add(f"aten::{name}.{overload or 'default'}")
    return sorted(out)


@dataclass
class TestCoreOps:
    test_id: str
    ops: list[str] = field(default_factory=list)     # aten::name.overload, first use first
    error: str | None = None


def _cached_path(cache_dir: Any, case: TestCase, seed: int) -> Path:
    """Where a test's core ops are kept: by its spec hash, the seed and torch's version
    (which decides the decomposition)."""
    from ..storage import open_tiers

    material = json.dumps([case.spec_hash, seed, torch.__version__])
    return open_tiers(cache_dir).root / "core-ops" / f"{hashlib.sha256(material.encode()).hexdigest()}.json"


@dataclass
class CoreOpsTask:
    """The ATen ops of one test's graph exported and decomposed to Core ATen (its seed's
    inputs), in a worker; kept in the artifact cache (`cache_dir`), so asking again after
    more checks costs no export."""

    key: str
    case: TestCase
    seed: int = 0
    cache_dir: Any = None

    def run(self, context: WorkerContext = WorkerContext()) -> TestCoreOps:
        path = _cached_path(self.cache_dir, self.case, self.seed) if self.cache_dir is not None else None
        if path is not None:
            try:
                return TestCoreOps(self.case.id, list(json.loads(path.read_text())["ops"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass      # absent or unreadable: export again
        out = self._survey()
        if path is not None and out.error is None:
            write_json_whole(path, {"test": self.case.id, "ops": out.ops})
        return out

    def _survey(self) -> TestCoreOps:
        from ..backends.family_common import export_program
        from ..execution.prepare import flat_module
        from ..suite.materialize import materialize

        out = TestCoreOps(self.case.id)
        try:
            prepared = flat_module(self.case, materialize(self.case, self.seed))
            program = export_program(prepared.module, prepared.inputs,
                                     {"use_default_decompositions": True, "export_strict": False}, True)
        except Exception as exc:
            out.error = str(exc) if isinstance(exc, OpdiffError) else error_text(exc)
            return out
        for node in program.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                name = f"{node.target.namespace}::{node.target._opname}.{node.target._overloadname}"
                if name not in out.ops:
                    out.ops.append(name)
        return out

    def failed(self, status: Verdict, error_class: str | None, message: str) -> TestCoreOps:
        return TestCoreOps(self.case.id, error=f"{status.value}: {message}")


@dataclass
class PresetCoverage:
    """Of the core ops the tests exercise: how many a preset's latest checks lowered (exported
    and loaded, or converted where it cannot run here), ran and passed, and how many no test
    of its history exercises."""

    preset: str
    lowered: int
    passed: int
    converted_only: int          # lowered, never run: the preset cannot run here (CoreML off macOS)
    not_checked: int
    failing: list[str] = field(default_factory=list)   # run, and no test passed


@dataclass
class Coverage:
    core: list[str]                          # the Core ATen op set
    exercised: dict[str, list[str]]          # core op -> the tests that exercise it
    other: dict[str, list[str]]              # ops outside the core set the graphs still hold
    presets: list[PresetCoverage]
    failed: list[TestCoreOps]                # tests with no graph

    @property
    def not_covered(self) -> list[str]:
        return [op for op in self.core if op not in self.exercised]


def preset_coverage(preset: str, exercised: Mapping[str, Sequence[str]],
                    latest: Mapping[tuple[str, str], tuple[Verdict, bool]]) -> PresetCoverage:
    """`latest`: (test id, preset) -> the latest verdict of the test there, and whether the
    preset exported it."""
    lowered = passed = converted = unseen = 0
    failing = []
    for op, tests in exercised.items():
        cells = [latest[(t, preset)] for t in tests if (t, preset) in latest]
        if not cells:
            unseen += 1
            continue
        ran = any(v in LOWERED for v, _ in cells)
        lowered += ran or any(v is Verdict.UNAVAILABLE and exported for v, exported in cells)
        if any(v is Verdict.PASS for v, _ in cells):
            passed += 1
        elif ran:
            failing.append(op)
        elif any(v is Verdict.UNAVAILABLE and exported for v, exported in cells):
            converted += 1
    return PresetCoverage(preset, lowered, passed, converted, unseen, failing)


def survey_coverage(suites: Sequence[Path] | None = None, *, presets: Sequence[str] = (),
                    latest: Mapping[tuple[str, str], tuple[Verdict, bool]], test_ids=None, tags=None, seed: int = 0,
                    settings: Settings | None = None, in_process: bool = False,
                    python: Path | None = None) -> Coverage:
    """The coverage of the selected tests; `presets` default to every preset `latest` names."""
    settings = settings or Settings()
    cases = select(given_cases(suites, settings.suites), test_ids, tags)
    if not cases:
        raise OpdiffError("no test selected: check the suites, --test-ids and --tags.")
    tasks = [CoreOpsTask(c.id, c, seed, settings.cache) for c in cases]
    with make_pool(settings, in_process, python=python) as pool:
        done = {t.test_id: t for t in pool.run(tasks)}
    surveyed = [done[c.id] for c in cases]
    core = core_aten_ops()
    core_set = set(core)
    exercised: dict[str, list[str]] = {}
    other: dict[str, list[str]] = {}
    for t in surveyed:
        for op in t.ops:
            (exercised if op in core_set else other).setdefault(op, []).append(t.test_id)
    exercised = {op: exercised[op] for op in core if op in exercised}
    names = list(presets) or sorted({p for _, p in latest})
    return Coverage(core, exercised, dict(sorted(other.items())),
                    [preset_coverage(p, exercised, latest) for p in names],
                    [t for t in surveyed if t.error])


def latest_verdicts(settings: Settings, warn=None) -> dict[tuple[str, str], tuple[Verdict, bool]]:
    """(test id, preset) -> the latest check verdict in the history of `settings.store` (the
    worst of its seeds') and whether the preset exported the test (a CoreML conversion off
    macOS is UNAVAILABLE, yet converted)."""
    from ..analytics.commands import history
    from ..analytics.reports import latest_cells

    with history(settings, warn) as a:
        rows = latest_cells(a).rows
    return {(t, p): (Verdict(v), bool(e)) for t, p, _, v, e in rows if v in Verdict.__members__}


def coverage(suites: Sequence[Path] | None = None, *, presets: Sequence[str] = (), test_ids=None, tags=None,
             seed: int = 0, settings: Settings | None = None, in_process: bool = False,
             python: Path | None = None, warn=None) -> Coverage:
    """`opdiff ops --coverage`: the selected tests' Core ATen coverage, judged per preset by
    the latest checks in the history store."""
    settings = settings or Settings()
    return survey_coverage(suites, presets=presets, latest=latest_verdicts(settings, warn), test_ids=test_ids,
                           tags=tags, seed=seed, settings=settings, in_process=in_process, python=python)
