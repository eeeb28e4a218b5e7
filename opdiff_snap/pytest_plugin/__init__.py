"""The pytest plugin (entry point `pytest11`: `opdiff`). Documentation: docs/pytest.md.

Two uses:

- `pytest --opdiff -b PRESET` collects one item per (test, seed, preset) of the
  project's suites and goldens (suite_items.py) and checks each like `opdiff check`;
- the `opdiff_golden` fixture checks a module built in the user's own test against a
  golden keyed by the test's node id, recording it on the baseline the first time
  (golden_fixture.py).

Dormant unless asked: without `--opdiff` (or `opdiff = true` in the ini file) it adds
its options and the fixture and nothing else; no item, no header line, and this module
imports nothing beyond pytest. Torch and the rest load only when a session is active or
the fixture is used. Both uses share one SessionRun (run.py): one worker pool, one
history run per session (per xdist worker, joined by a group id).
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .options import PLUGIN_KEY, Options, plugin_of

if TYPE_CHECKING:  # pragma: no cover
    from .run import SessionRun

GROUP_KEY = "opdiff_group"   # xdist workerinput key: the group id the controller made


class Plugin:
    """Per-config state: the options, and the session run once something needs it."""

    def __init__(self, config: pytest.Config, options: Options):
        self.config, self.options = config, options
        self._run: SessionRun | None = None
        self.summary: dict[str, list[str]] = {}     # merged from xdist workers (controller)
        # the session's group id; an xdist worker takes its controller's
        self.group: str = getattr(config, "workerinput", {}).get(GROUP_KEY) or secrets.token_hex(4)

    @property
    def started(self) -> bool:
        return self._run is not None

    def run(self) -> "SessionRun":
        """The session run, made on first use; a project setting it cannot use (a bad
        [tool.opdiff] table) stops the session with one paragraph, exit code 2."""
        if self._run is None:
            from ..core.errors import OpdiffError
            from .run import SessionRun

            try:
                self._run = SessionRun(self.config, self.options, self.group)
            except OpdiffError as exc:
                pytest.exit(f"opdiff: error: {exc}", returncode=2)
        return self._run




def _whole(limit: str):
    def parse(text: str) -> int:
        from ..core import limits  # here, not above: a dormant plugin imports nothing beyond pytest

        try:
            return int(getattr(limits, limit).parse(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None

    parse.__name__ = limit.lower()
    return parse


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opdiff", "opdiff-snap: goldens as tests (docs/pytest.md)")
    group.addoption("--opdiff", action="store_true", default=False,
                    help="Collect the project's suites and goldens as test items (one per test, seed "
                         "and preset) and check them like `opdiff check`.")
    backend = dict(action="append", dest="opdiff_backends", metavar="PRESET", default=None,
                   help="Target preset of --opdiff items, and the default targets of the opdiff_golden "
                        "fixture; repeatable (`opdiff list-presets`).")
    try:  # pytest reserves lowercase short options for itself; -b is not one of its own
        group._addoption("-b", "--opdiff-backend", **backend)
    except (AttributeError, ValueError, argparse.ArgumentError):
        group.addoption("--opdiff-backend", **backend)
    group.addoption("--opdiff-preset-options", action="append", metavar="PRESET=JSON", default=None,
                    help="Options of one preset, as JSON or a JSON file path; repeatable.")
    group.addoption("--opdiff-update", action="store_true", default=False,
                    help="opdiff_golden: re-record stale goldens on the baseline and prune unused ones.")
    group.addoption("--opdiff-jobs", type=_whole("JOBS"), default=None, metavar="N",
                    help="Worker processes (default: [tool.opdiff] jobs, else the cores; under xdist, "
                         "the cores shared among its workers).")
    group.addoption("--opdiff-batch", type=_whole("BATCH"), default=None, metavar="N",
                    help="Tests one exporter call may compile together, as check's --batch (default: "
                         "[tool.opdiff] batch, else 16); 1 exports each test by itself.")
    parser.addini("opdiff", type="bool", default=False, help="Act as if --opdiff were given.")
    parser.addini("opdiff_backends", type="args", default=[],
                  help="Target presets when no -b is given (opdiff plugin).")
    parser.addini("opdiff_baseline", type="string", default="torch_cpu_fp32",
                  help="Preset the opdiff_golden fixture records goldens with.")


def pytest_configure(config: pytest.Config) -> None:
    options = Options.of(config)
    plugin = Plugin(config, options)
    config.stash[PLUGIN_KEY] = plugin
    if not options.enabled:
        return
    config.addinivalue_line("markers", "opdiff: an item checking a golden of the project's suites")
    from ..core.errors import OpdiffError

    try:
        plugin.run().validate()
    except OpdiffError as exc:
        pytest.exit(f"opdiff: error: {exc}", returncode=2)
    plugin.run().start_workers()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: give every worker the same group id."""
    node.workerinput[GROUP_KEY] = plugin_of(node.config).group


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: gather each worker's summary lines."""
    lines = (getattr(node, "workeroutput", None) or {}).get("opdiff_summary") or {}
    plugin = plugin_of(node.config)
    for section, values in lines.items():
        kept = plugin.summary.setdefault(section, [])
        kept.extend(v for v in values if v not in kept)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    plugin = plugin_of(config)
    if not plugin.options.enabled:
        return None
    if not plugin.started:
        return [f"opdiff: backends {', '.join(plugin.options.backends) or '(none)'}"]
    return plugin.run().header()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    plugin = plugin_of(parent.config)
    if not plugin.options.enabled or file_path.suffix not in (".yaml", ".yml"):
        return None
    run = plugin.run()
    if not run.claims_suite(file_path):
        return None
    from .suite_items import SuiteFile

    return SuiteFile.from_parent(parent, path=file_path)


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    plugin = plugin_of(parent.config)
    if not plugin.options.enabled:
        return None
    run = plugin.run()
    if not run.claims_goldens(path):
        return None
    from .suite_items import GoldensDir

    return GoldensDir.from_parent(parent, path=path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Before -k / -m deselect: add the suites and goldens that collection did not walk
    into (a bare `pytest --opdiff` whose testpaths do not cover them), and note every
    collected item for the fixture's unused-golden report."""
    plugin = plugin_of(config)
    if plugin.options.enabled:
        plugin.run().add_uncollected(session, items)
    if plugin.options.enabled or plugin.options.update or _uses_fixture(items):
        plugin.run().note_collected(items)


def _uses_fixture(items: list) -> bool:
    return any("opdiff_golden" in getattr(item, "fixturenames", ()) for item in items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    plugin = plugin_of(item.config)
    if plugin.started:
        plugin.run().next_item = nextitem


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> None:
    if call.when == "call" and call.excinfo is None:
        plugin = plugin_of(item.config)
        if plugin.started:
            plugin.run().passed.add(item.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    plugin = plugin_of(session.config)
    if not plugin.started:
        return
    lines = plugin.run().finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["opdiff_summary"] = lines
    else:
        for section, values in lines.items():
            plugin.summary.setdefault(section, []).extend(values)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    plugin = plugin_of(config)
    shown = {k: v for k, v in plugin.summary.items() if v}
    if not shown:
        return
    terminalreporter.section("opdiff")
    for section, values in shown.items():
        terminalreporter.write_line(f"{section}:")
        for value in values:
            terminalreporter.write_line(f"  {value}")


@pytest.fixture
def opdiff_golden(request: pytest.FixtureRequest):
    """Check a module (or function) of this test against its golden on one or more
    backends: `opdiff_golden.check(module, (x,), backends=[...])`. The first run records
    the golden on the baseline preset; docs/pytest.md."""
    from .golden_fixture import GoldenFixture

    return GoldenFixture(plugin_of(request.config).run(), request.node)
