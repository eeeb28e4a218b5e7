"""The project's suites and goldens as pytest items: one per (test, seed, preset).

Planning is check's own (run.check_plan.plan_from_suites, or plan_from_goldens without
suites), made once per session. Items are grouped under the suite file that defines
their test (`suites/core_aten.yaml::add__x[s0-onnx_cpu_fp32]`); goldens of tests no
suite defines any more, and every golden of a project without suites, sit under the
golden store's folder (`goldens::old_test[s0-onnx_cpu_fp32]`). A test's tags are its
markers, and every item is marked `opdiff`.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pytest

from ..core.errors import OpdiffError
from ..core.safetext import printable
from .options import plugin_of
from .outcomes import VerdictFailed, describe, settle

if TYPE_CHECKING:
    from ..backends.base import Preset
    from ..run.check_plan import Planned


class SuitePlan:
    """What the session checks: checking's plan, grouped by the file that defines each test."""

    def __init__(self, run: Any = None):
        self.suite_paths: list[Path] = []
        self.by_file: dict[Path, list[Planned]] = {}
        self.loose: list[Planned] = []
        if run is None:
            return
        from ..run.check_plan import plan_from_goldens, plan_from_suites
        from ..suite import load_suites, suite_paths
        from ..suite.reader import SuiteReader

        settings = run.settings
        store = run.goldens
        reader = SuiteReader()
        self.suite_paths = suite_paths(None, settings.suites, reader)
        if self.suite_paths:
            plan = plan_from_suites(load_suites(self.suite_paths, reader=reader), store, report_orphans=True)
        elif store.exists():
            plan = plan_from_goldens(store)
        else:
            return
        for planned in plan.items:
            if self.suite_paths and planned.case is not None:
                self.by_file.setdefault(Path(planned.case.suite), []).append(planned)
            else:
                self.loose.append(planned)

    @classmethod
    def empty(cls) -> "SuitePlan":
        return cls()

    def files(self) -> list[Path]:
        return list(self.by_file)

    def for_file(self, path: Path) -> list[Planned]:
        want = Path(path).resolve()
        return [p for f, items in self.by_file.items() if f.resolve() == want for p in items]


def _run(node: Any):
    return plugin_of(node.config).run()


def _items(parent: pytest.Collector, planned: Iterable[Planned]) -> Iterable["OpdiffItem"]:
    run = _run(parent)
    for item in planned:
        for preset in run.presets:
            yield OpdiffItem.from_parent(parent, name=printable(f"{item.test_id}[s{item.seed}-{preset.name}]"),
                                         planned=item, preset=preset)


class _OpdiffCollector:
    """Our errors (a suite that does not load, goldens no suite vouches for) are one
    paragraph, not a traceback."""

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, OpdiffError):
            return printable(f"opdiff: error: {excinfo.value}", lines=True)
        return super().repr_failure(excinfo)  # type: ignore[misc]


class SuiteFile(_OpdiffCollector, pytest.File):
    """The items of the tests one suite file defines."""

    def collect(self) -> Iterable["OpdiffItem"]:
        run = _run(self).collected(self)
        return list(_items(self, run.plan().for_file(self.path)))


class GoldensDir(_OpdiffCollector, pytest.Directory):
    """The items of goldens no suite file defines (or of every golden, without suites)."""

    def collect(self) -> Iterable["OpdiffItem"]:
        run = _run(self).collected(self)
        return list(_items(self, run.plan().loose))


def collect_node(collector: pytest.Collector) -> list[pytest.Item]:
    """Collect a collector added after pytest's own collection, reporting it as pytest
    reports its own (so `collected N items`, collection errors and --collect-only see it)."""
    ihook = collector.ihook
    ihook.pytest_collectstart(collector=collector)
    report = ihook.pytest_make_collect_report(collector=collector)
    ihook.pytest_collectreport(report=report)
    out: list[pytest.Item] = []
    if report.passed:
        for node in report.result:
            if isinstance(node, pytest.Item):
                node.ihook.pytest_itemcollected(item=node)
                out.append(node)
            elif isinstance(node, pytest.Collector):
                out.extend(collect_node(node))
    return out


class OpdiffItem(pytest.Item):
    """One (test, seed, preset) of the project's goldens."""

    def __init__(self, *, planned: Planned, preset: Preset, **kwargs: Any):
        super().__init__(**kwargs)
        self.planned, self.preset = planned, preset
        self.add_marker("opdiff")
        tags = planned.case.tags if planned.case is not None else ()
        known = set(self.config.getini("markers"))
        for tag in tags:
            if not tag or tag.startswith("_"):
                continue
            line = f"{tag}: opdiff suite tag"
            if line not in known:
                self.config.addinivalue_line("markers", line)
            self.add_marker(tag)

    @property
    def key(self) -> str:
        from ..run.check_job import job_key

        return job_key(self.planned.test_id, self.planned.seed, self.preset.name)

    def runtest(self) -> None:
        run = _run(self)
        result = run.result_for(self)
        self.user_properties.append(("opdiff_verdict", result.verdict.value))
        from ..core.verdicts import Verdict

        expected_as = run.expectation(result)
        settle([result], {Verdict.NO_GOLDEN: self.fix(), Verdict.STALE: self.fix(),
                          Verdict.CORRUPT: self.fix(force=True)},
               expected=expected_as, strict=run.settings.strict_expectations)

    def fix(self, force: bool = False) -> str:
        """The command that (re-)records this golden, or prunes it when no suite defines it."""
        planned = self.planned
        if planned.case is None:
            return "opdiff goldens prune" if not force else "opdiff goldens verify; opdiff goldens prune"
        baseline = planned.baseline or "torch_cpu_fp32"
        return (f"opdiff record --baseline {baseline} --test-ids {shlex.quote(planned.test_id)} "
                f"--seed-list {planned.seed}" + (" --force" if force else ""))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (VerdictFailed, OpdiffError)):
            return printable(excinfo.value, lines=True)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, printable(f"{self.planned.test_id} seed {self.planned.seed} on {self.preset.name}")


__all__ = ["GoldensDir", "OpdiffItem", "SuiteFile", "SuitePlan", "collect_node", "describe"]
