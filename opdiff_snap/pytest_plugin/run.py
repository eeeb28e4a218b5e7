"""One pytest session's opdiff run: settings, presets, the worker pool, the history.

Made when a session is active (`--opdiff`) or the opdiff_golden fixture is first used,
and finished at session end. Everything that runs user code or a backend goes through
one Dispatcher over one WorkerPool, started when the session is configured (its workers
warm up while pytest collects) and closed at session end.

Suite items are queued all at once at the first item that runs, so the pool's workers
stay busy while pytest walks the items one by one; each item then waits for its own
result. Under xdist a worker queues what it knows it will run: the items of the item's
suite file when xdist hands out whole files (`--dist loadfile` or `loadscope`), else the
item and the next one it was handed. What is queued together is compiled in batches
first, as `opdiff check` compiles (execution/batch.py, `--opdiff-batch`), and an item
whose batch-compiled artifact does not PASS is run again alone, whose verdict it gets.

History: one run file per session, or per xdist worker, written as `opdiff check`
writes them (results.Result lines, through pipeline.Sinks) with `runner: "pytest"` and a
`run_group` the xdist workers of one session share, so `opdiff runs` and the reports take
them as one logical run, as they do the shards of a check. The run file is
created with the first result, so a session that checks nothing writes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pytest

from ..backends.base import Preset
from ..backends.registry import get_preset
from ..compare.results import Result, RunReport
from ..core.config import Settings, load_settings
from ..core.errors import OpdiffError
from ..core.safetext import printable
from ..execution.batch import compile_ahead, rerun_alone
from ..execution.dispatch import Dispatcher, Ready
from ..execution.job import Task
from ..execution.pools import make_pool
from ..execution.runner import Job
from ..execution.warmup import warm_ups
from ..expectations.standing import Expecter
from ..goldens import GoldenStore
from ..history.runs import check_store_dir
from ..history.writer import RunStart, RunWriter
from ..run.check import cache_usable
from ..run.check_job import item_work
from ..run.judge import Pending, judge
from ..run.pipeline import Sinks
from ..run.session import settings_json
from .options import Options

if TYPE_CHECKING:
    from .suite_items import SuitePlan

PATH_SETTINGS = ("suites", "goldens", "store", "cache", "expectations")


def _display(path: Path) -> Path:
    """`path` relative to the working directory when it lies below it (as the CLI's
    defaults are), so history written from pytest names suites as `opdiff check` does."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def session_settings(config: pytest.Config, options: Options) -> Settings:
    """[tool.opdiff] of the rootdir's pyproject.toml over the defaults, relative paths
    taken from the rootdir, --opdiff-jobs over both; under xdist the default worker count
    is the cores shared among xdist's workers."""
    root = Path(config.rootpath)
    settings = load_settings(root)
    paths = {}
    for name in PATH_SETTINGS:
        value = Path(getattr(settings, name))
        paths[name] = _display(value if value.is_absolute() else root / value)
    jobs = options.jobs
    workers = getattr(config, "workerinput", {}).get("workercount")
    if jobs is None and workers and settings.jobs == Settings().jobs:
        jobs = max(1, (os.cpu_count() or 1) // int(workers))
    return settings.with_overrides(jobs=jobs, batch=options.batch, **paths)


class SessionRun:
    def __init__(self, config: pytest.Config, options: Options, group: str):
        self.config, self.options, self.group = config, options, group
        self.settings = session_settings(config, options)
        workerinput = getattr(config, "workerinput", None)
        self.worker_id: str | None = workerinput.get("workerid") if workerinput else None
        self.next_item: pytest.Item | None = None
        self.passed: set[str] = set()             # node ids whose call phase passed
        self.collected_ids: set[str] = set()
        self.collected_files: set[Path] = set()
        self.sinks = Sinks()   # its writer is set with the first result
        self.summary: dict[str, list[str]] = {}   # section -> lines, shown at session end
        self.used: set[tuple[Path, str]] = set()  # (fixture golden store, test id) checked
        self._presets: dict[str, Preset] = {}
        self._plan: SuitePlan | None = None
        self._plan_error: Exception | None = None
        self._collected_paths: set[Path] = set()
        self._dispatcher: Dispatcher | None = None
        self._pending: dict[str, Pending] = {}
        self._jobs: dict[str, Job] = {}           # the job of each pending key, for a rerun alone
        self._ahead = [0.0, 0.0, 0.0, 0.0]        # compiled ahead: tests, of jobs, exporter calls, ms
        self._taken: set[str] = set()
        self._use_cache: bool | None = None
        self._started = time.perf_counter()
        self.expectations: Any = None   # expectations.entries.Expectations, read by validate
        self._expecter: Expecter | None = None

    # ------------------------------------------------------------ setup
    def validate(self) -> None:
        """Resolve the presets and check the store paths, before anything is collected."""
        for name in self.options.preset_options:
            self.preset(name)
        _ = self.presets   # resolving them is the check
        check_store_dir(self.settings.store)
        _ = self.goldens   # opening the store is the check
        from .. import api

        self.expectations = api.load_expectations(settings=self.settings)   # None: no file
        if self.expectations is not None:
            self._expecter = Expecter(self.expectations, ())
            self.sinks.annotate = self._expecter

    def expectation(self, result: Result) -> Any:
        """The expectation (that holds) naming `result`, if any (whether each holds is
        asked of the installed versions once per session)."""
        if self._expecter is None:
            return None
        return self._expecter.holding(self.expectations.match(result.preset, result.test_id, result.seed))

    @functools.cached_property
    def goldens(self) -> GoldenStore:
        """The project's golden store, opened once (a remote one caches what it has read)."""
        return GoldenStore(self.settings.goldens)

    def preset(self, name: str) -> Preset:
        if name not in self._presets:
            self._presets[name] = get_preset(name, self.options.preset_options.get(name))
        return self._presets[name]

    @property
    def presets(self) -> list[Preset]:
        """The presets of --opdiff items (-b, or the ini's opdiff_backends)."""
        return [self.preset(name) for name in self.options.backends]

    @property
    def use_cache(self) -> bool:
        if self._use_cache is None:
            self._use_cache = cache_usable(self.settings, None)
        return self._use_cache

    def header(self) -> list[str]:
        s = self.settings
        where = f"; xdist group {self.group}" if self.worker_id else ""
        backends = ", ".join(self.options.backends) or "(none: give -b PRESET to collect suites)"
        return [f"opdiff: backends {backends}; suites {s.suites}, goldens {s.goldens}, history {s.store}; "
                f"{s.jobs} worker process(es){where}"]

    # ------------------------------------------------------------ collection
    def claims_suite(self, path: Path) -> bool:
        """A YAML file under the suites folder is collected as a suite."""
        try:
            Path(path).resolve().relative_to(Path(self.settings.suites).resolve())
        except ValueError:
            return False
        return bool(self.options.backends)

    def claims_goldens(self, path: Path) -> bool:
        return bool(self.options.backends) and Path(path).resolve() == Path(self.settings.goldens).resolve()

    def collected(self, collector: pytest.Collector) -> "SessionRun":
        """Note that `collector` is collecting (pytest makes collectors for every entry of
        a folder it walks, and collects only those its arguments lead to)."""
        self._collected_paths.add(Path(collector.path).resolve())
        return self

    def plan(self):
        """The session's check plan (suite_items.SuitePlan), made once. When it cannot be
        made, the first collector that asks gets the error and the others an empty plan,
        so the problem is reported once."""
        plan = self._make_plan()
        if self._plan_error is not None:
            error, self._plan_error = self._plan_error, None
            raise error
        return plan

    def _make_plan(self):
        from .suite_items import SuitePlan

        if self._plan is None:
            try:
                self._plan = SuitePlan(self)
            except Exception as exc:
                self._plan, self._plan_error = SuitePlan.empty(), exc
        return self._plan

    def add_uncollected(self, session: pytest.Session, items: list) -> None:
        """A bare `pytest --opdiff` collects the suites and the goldens even where its
        testpaths do not reach; named paths collect what they name."""
        if not self.options.backends or self.config.args_source == pytest.Config.ArgsSource.ARGS:
            return
        from .suite_items import GoldensDir, SuiteFile, collect_node

        plan = self._make_plan()
        files = plan.files()
        goldens = Path(self.settings.goldens)
        if self._plan_error is not None:   # a collector that reports it
            files = _suite_files(self.settings.suites)[:1]
        for path in files:
            if path.resolve() not in self._collected_paths:
                items.extend(collect_node(SuiteFile.from_parent(session, path=_absolute(path))))
        if (plan.loose or self._plan_error is not None) and goldens.resolve() not in self._collected_paths:
            items.extend(collect_node(GoldensDir.from_parent(session, path=_absolute(goldens))))

    def note_collected(self, items: list) -> None:
        for item in items:
            self.collected_ids.add(item.nodeid)
            path = getattr(item, "path", None)
            if path is not None and Path(path).suffix == ".py":
                self.collected_files.add(Path(path).resolve())

    # ------------------------------------------------------------ running
    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            self._dispatcher = Dispatcher(make_pool(self.settings, in_process=False))
        return self._dispatcher

    def start_workers(self) -> None:
        """Start the pool's workers now, warming up the presets' backends while pytest
        collects (not on an xdist controller, which runs no items)."""
        controller = self.worker_id is None and bool(getattr(self.config.option, "numprocesses", None))
        if self.options.backends and not controller:
            cached = self.use_cache and Path(str(self.settings.cache)).exists()
            self.dispatcher.pool.prestart(warm_ups(self.presets, self.settings.cache if cached else None))

    def submit(self, key: str, make: Callable[[], Task | Ready]) -> None:
        self.dispatcher.submit(key, make)

    def wait(self, key: str) -> Any:
        return self.dispatcher.wait(key)

    def result_for(self, item: Any) -> Result:
        """The Result of one suite item (suite_items.OpdiffItem): queued with the others
        when the first one runs, judged here."""
        key = item.key
        if key in self._taken:      # run again (a rerun plugin): on its own
            self._taken.discard(key)
            self.dispatcher.submit(key, self._maker(item))
        elif not self.dispatcher.queued(key):
            self._queue_items(item)
        value = self.dispatcher.wait(key)
        self._taken.add(key)
        if isinstance(value, Result):
            result = value
        else:
            pending, job = self._pending.pop(key), self._jobs.pop(key)
            result = judge(pending, value)
            if rerun_alone(job, value.batch, result.verdict):   # only a run alone gives its verdict
                self.dispatcher.put(key, dataclasses.replace(job, alone=True, batched=0))
                result = judge(pending, self.dispatcher.wait(key))
        self.emit(result)
        return result

    def _queue_items(self, item: Any) -> None:
        fresh = [it for it in self._together(item) if it.key not in self._taken and not self.dispatcher.queued(it.key)]
        if self.settings.batch < 2 or not self.use_cache or len(fresh) < 2:
            for it in fresh:      # each item's goldens are read when its job is about to start
                self.dispatcher.submit(it.key, self._maker(it))
            return
        made = {it.key: self._made(it) for it in fresh}
        jobs = [work for work in made.values() if isinstance(work, Job)]
        done = compile_ahead(self.dispatcher, jobs, self.settings.batch)
        self._ahead = [a + b for a, b in zip(self._ahead, (done.tests, len(jobs), done.calls, done.export_ms))]
        for why in done.lost:
            self.note("batches", f"a batch could not be compiled ({why}); its items were exported one by one")
        for it in fresh:
            self.dispatcher.put(it.key, made[it.key])

    def _together(self, item: Any) -> list[Any]:
        """The suite items to queue with `item`: those this process will run."""
        from .suite_items import OpdiffItem

        everything = [i for i in item.session.items if isinstance(i, OpdiffItem)]
        if self.worker_id is not None:
            if getattr(self.config.option, "dist", None) in ("loadfile", "loadscope"):
                scope = item.nodeid.rsplit("::", 1)[0]   # xdist hands this worker the whole file
                everything = [i for i in everything if i.nodeid.rsplit("::", 1)[0] == scope]
            else:   # items come one by one: this and the next
                everything = [item] + ([self.next_item] if isinstance(self.next_item, OpdiffItem) else [])
        if item not in everything:
            everything.insert(0, item)
        return everything

    def _made(self, item: Any) -> Task | Ready | Exception:
        """An item's work made now (its goldens read): a Job, a Ready result, or what making
        it raised (raised again when that item waits for its result)."""
        try:
            return self._maker(item)()
        except Exception as exc:
            return exc

    def _maker(self, item: Any) -> Callable[[], Task | Ready]:
        def make() -> Task | Ready:
            decided, runs = item_work(item.planned, [item.preset], self.goldens,
                                      settings=self.settings, use_cache=self.use_cache)
            if decided:
                return Ready(decided[0])
            job, pending = runs[0]
            self._pending[job.key] = pending
            self._jobs[job.key] = job
            return job

        return make

    def emit(self, result: Result) -> None:
        """Write one result to this session's history run (started with the first)."""
        if self.sinks.writer is None:
            self.sinks.writer = self._start_writer()
        try:
            self.sinks(result)
        except OpdiffError as exc:
            pytest.exit(f"opdiff: error: {exc}", returncode=2)

    def _start_writer(self) -> RunWriter:
        pool = self.dispatcher.pool
        suites = [str(p) for p in self._plan.suite_paths] if self._plan is not None else []
        presets = {p.name: p.to_json() for p in self._presets.values()}
        extra = {"runner": "pytest"}
        if self.worker_id is not None:
            extra["xdist_worker"] = self.worker_id
        try:
            return RunWriter.start(self.settings.store, RunStart(
                "check", list(self.config.invocation_params.args), suites, presets,
                settings_json(self.settings, False, self.use_cache, pool), env=pool.environment(),
                extra=extra, run_group=self.group))
        except OpdiffError as exc:
            pytest.exit(f"opdiff: error: {exc}", returncode=2)

    # ------------------------------------------------------------ end
    def note(self, section: str, line: str) -> None:
        """A line for the session's summary (control characters escaped)."""
        line = printable(line)
        lines = self.summary.setdefault(section, [])
        if line not in lines:
            lines.append(line)

    def finish(self, interrupted: bool = False) -> dict[str, list[str]]:
        """Close the pool, sweep the fixture's goldens, write the end line (not after an
        interrupt: the run then reads as interrupted); the summary."""
        if self._dispatcher is not None:
            self._dispatcher.close()
        from .golden_fixture import sweep

        tests, jobs, calls, ms = self._ahead
        if calls:
            self.note("batches", f"{self.worker_id or 'session'}: compiled {tests:.0f} of {jobs:.0f} items in "
                                 f"{calls:.0f} exporter calls ({ms / 1e3:.1f} s; --opdiff-batch "
                                 f"{self.settings.batch}, 1 exports each by itself)")

        try:
            sweep(self)
        except OpdiffError as exc:
            self.summary.setdefault("errors", []).append(str(exc))
        writer = self.sinks.writer
        if writer is not None and interrupted:
            writer.close()
            self.note("history", f"{writer.path} (interrupted: {len(self.sinks.results)} results, no end line)")
        elif writer is not None:
            wall = time.perf_counter() - self._started
            report = RunReport(writer.run_id, writer.path, "check", self.sinks.results, wall)
            counts = report.counts()
            writer.end(counts, wall)
            tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
            self.summary.setdefault("history", []).append(
                f"{writer.path} ({len(self.sinks.results)} results: {tally}; group {self.group})")
        return self.summary


def _suite_files(root: Path) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml")) if root.is_dir() else []


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))
