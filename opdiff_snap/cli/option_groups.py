"""Option groups: each declares its flags once and parses them into one typed value.

A command composes groups with `@uses(...)` (placed right above the command function):
click parses every flag, and the command receives one argument per group, named by the
group, holding what that group made of its flags (a `Selection`, the `Settings` with the
worker flags applied, a `Tolerance`, ...). Adding a flag means editing its group and the
code that uses its value, nothing in between.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

from ..core import limits
from ..core.errors import OpdiffError
from ..core.limits import FlagError, Number
from ..core.verdicts import NOT_FAILING, PRECEDENCE, Verdict
from .app import JOBS, NON_NEGATIVE, TIMEOUT_S, patterns, python_option, settings_of

REPEATS = Number(limits.REPEATS)
BATCH = Number(limits.BATCH)
WARMUP = Number(limits.WARMUP)
SEED_COUNT = Number(limits.SEED_COUNT)


@dataclass(frozen=True)
class Group:
    """Flags (click.option/argument decorators) that `parse(values)` turns into the value
    the command receives as `name`; `values` maps each flag's parameter name to what click
    parsed."""

    name: str
    flags: tuple[Callable, ...]
    parse: Callable[[dict[str, Any]], Any]
    params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        probe = _decorate(lambda: None, self.flags)
        object.__setattr__(self, "params", tuple(p.name for p in getattr(probe, "__click_params__", [])))


def _decorate(fn: Callable, flags: tuple[Callable, ...]) -> Callable:
    for flag in reversed(flags):
        fn = flag(fn)
    return fn


def uses(*groups: Group) -> Callable:
    """The command's flags are those of `groups` (in order) beside its own; each group's
    values reach the command as one argument, parsed inside the command's error handling."""
    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(*args, **values):
            for group in groups:
                mine = {name: values.pop(name) for name in group.params}
                values[group.name] = group.parse(mine)
            return fn(*args, **values)

        flags = tuple(flag for group in groups for flag in group.flags)
        return _decorate(command, flags)

    return decorate


def ctx_settings(**overrides):
    return settings_of(click.get_current_context(), **overrides)


# ---------------------------------------------------------------- which tests

def parse_seed_list(text: str | None) -> list[int] | None:
    """`--seed-list 0,3,7`: the seeds, each once, in the order given (None when not given)."""
    if not text:
        return None
    seeds = []
    for part in (p for p in text.replace(";", ",").split(",") if p.strip()):
        try:
            seeds.append(int(limits.SEED.parse(part)))
        except ValueError as exc:
            raise OpdiffError(f"--seed-list {text!r}: seed {part.strip()!r}: {exc} (seeds are comma-separated, "
                              "e.g. 0,3,7).") from None
    return list(dict.fromkeys(seeds))  # a seed given twice runs once


def _selection(values: dict[str, Any]):
    from ..run.requests import Selection

    return Selection(list(values["suites"]) or None, patterns(values["test_ids"]), patterns(values["tags"]),
                     values["seeds"], parse_seed_list(values["seed_list"]))


SUITES = click.argument("suites", nargs=-1, type=click.Path(path_type=Path))

SELECTION = Group("selection", (
    SUITES,
    click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable."),
    click.option("--tags", multiple=True, help="Only tests with this tag; repeatable."),
    click.option("--seeds", type=SEED_COUNT, help="Use seeds 0..N-1 instead of each test's."),
    click.option("--seed-list", help="Use exactly these seeds, e.g. 0,3,7."),
), _selection)


# ---------------------------------------------------------------- how jobs run

_WORKER_FLAGS = {
    "jobs": click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores)."),
    "timeout_s": click.option("--timeout-s", type=TIMEOUT_S, help="Per-job timeout in seconds (>= 0.1)."),
    "repeats": click.option("--repeats", type=REPEATS, help="Timed calls per job (median reported)."),
    "warmup": click.option("--warmup", type=WARMUP, help="Untimed warm-up calls per job."),
    "batch": click.option("--batch", type=BATCH, help="Tests one exporter call may compile together, each then "
                          "loaded and run alone (default 16; 1: export each test alone)."),
}


def workers(*names: str) -> Group:
    """The worker flags `names` (of jobs, timeout_s, repeats, warmup, batch), parsed into
    the command's Settings with those given applied."""
    return Group("settings", tuple(_WORKER_FLAGS[n] for n in names),
                 lambda values: ctx_settings(**values))


PYTHON = python_option
IN_PROCESS = click.option("--in-process", is_flag=True, help="Run jobs in this process (debugging; no isolation).")
NO_CACHE = click.option("--no-cache", is_flag=True,
                        help="Re-export even when a cached artifact or a cached export/load failure exists.")


def running(python: bool = True, cache: bool = True) -> Group:
    """Where the jobs run (--in-process, --python) and with the artifact cache or not."""
    def parse(values: dict[str, Any]):
        from ..run.requests import Running

        return Running(in_process=values["in_process"], python=values.get("python"),
                       use_cache=not values.get("no_cache", False))

    flags = (IN_PROCESS,) + ((PYTHON,) if python else ()) + ((NO_CACHE,) if cache else ())
    return Group("running", flags, parse)


TRUST_GOLDENS = click.option(
    "--trust-goldens", is_flag=True,
    help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, user packages, "
         "ops with effects); they run in workers, and the run says which.")


# ---------------------------------------------------------------- targets and tolerances

def parse_preset_options(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, body = value.partition("=")
        if not sep or not name or not body:
            raise OpdiffError(f"--preset-options '{value}': write PRESET=JSON or PRESET=path/to/options.json, "
                              "e.g. onnx_cpu_fp32='{\"opset\": 18}'.")
        out[name] = body
    return out


@dataclass(frozen=True)
class Targets:
    backends: list[str]
    preset_options: dict[str, str]


TARGETS = Group("targets", (
    click.option("-b", "--backend", "backends", multiple=True,
                 help="Target preset; repeatable (see `opdiff list-presets`)."),
    click.option("--preset-options", multiple=True, help="PRESET=JSON (string or file path); repeatable."),
), lambda values: Targets(list(values["backends"]), parse_preset_options(values["preset_options"])))


def _tolerance(values: dict[str, Any]):
    from ..suite.model import Tolerance

    given = (values["atol"], values["rtol"], values["baseline_factor"], values["precision_factor"])
    return Tolerance(*given) if any(v is not None for v in given) else None


TOLERANCE = Group("tolerance", (
    click.option("--atol", type=NON_NEGATIVE, help="Override the absolute tolerance for every comparison."),
    click.option("--rtol", type=NON_NEGATIVE, help="Override the relative tolerance for every comparison."),
    click.option("--baseline-factor", type=NON_NEGATIVE,
                 help="Times the baseline's own rounding error a result may differ by (default 4; 0: off)."),
    click.option("--precision-factor", type=NON_NEGATIVE,
                 help="fp16/bf16: times torch eager's own error at that precision a composite output may reach "
                      "(default 1.75; 0: off)."),
), _tolerance)


# ---------------------------------------------------------------- what a run reports

@dataclass(frozen=True)
class Reporting:
    """How a run's results are shown and judged: the format, every result or the failing
    ones, the verdicts that fail the exit code, JUnit and Markdown summaries."""

    fmt: str = "text"
    verbose: bool = False
    fail_on: str | None = None
    junit: Path | None = None
    summary_md: Path | None = None


_FAIL_ON_DEFAULT = ", ".join(v.value for v in reversed(PRECEDENCE) if v in NOT_FAILING)


def reporting(fail_on_help: str, summary: bool = False) -> Group:
    flags: tuple[Callable, ...] = (
        click.option("--fail-on", help=fail_on_help),
        click.option("--junit", type=click.Path(path_type=Path), help="Also write JUnit XML here."),
        click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text"),
        click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too."),
    )
    if summary:
        flags += (click.option(
            "--summary-md", type=click.Path(path_type=Path, dir_okay=False),
            help="Write a Markdown summary here (counts per preset, what needs a look first, the command to run "
                 "next); in GitHub Actions it goes to the job summary without this."),)
    return Group("reporting", flags, lambda values: Reporting(**values))


RECORD_REPORTING = reporting("Verdicts that make the exit code 1 (default: BASELINE_FAIL and the like).")
CHECK_REPORTING = reporting("Comma-separated verdicts that make the exit code 1 (default: all but "
                            f"{_FAIL_ON_DEFAULT}).", summary=True)


def fail_verdicts(text: str | None) -> set[Verdict]:
    from .output import parse_fail_on

    return parse_fail_on(text)


# ---------------------------------------------------------------- where a check's run goes

@dataclass(frozen=True)
class Placement:
    """Which run a check writes: a new one, the interrupted one it resumes, or one shard
    of a run group; and whether its outputs come from a device's replay bundle."""

    resume: str | None = None
    shard: tuple[int, int] | None = None
    run_group: str | None = None
    outputs_from: Path | None = None   # a replay bundle: the outputs a device returned, judged instead of running


def _shard(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[int, int] | None:
    from ..history.sharding import parse_shard

    try:
        return parse_shard(text) if text else None
    except OpdiffError as exc:
        raise FlagError(str(exc).removeprefix(f"--shard {text!r}: "), text, ctx, param) from None


PLACEMENT = Group("placement", (
    click.option("--resume", "resume", metavar="RUN_ID", help="Finish an interrupted run (see `opdiff runs`)."),
    click.option("--shard", metavar="K/N", callback=_shard,
                 help="Run the K-th of N shards of the planned jobs (with --run-group)."),
    click.option("--run-group", metavar="ID", help="Logical run this run belongs to (the N shards share it)."),
    click.option("--outputs-from", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
                 help="Judge the outputs a device returned in this replay bundle (`opdiff bundle`) instead of "
                      "running the presets here; the presets default to the bundle's."),
), lambda values: Placement(**values))


@dataclass(frozen=True)
class Expecting:
    """The expectations file a check is held to, and whether the run rewrites it."""

    expectations: Any
    path: Path
    update: bool


@dataclass(frozen=True)
class ExpectationsFlags:
    path: Path | None = None
    update: bool = False

    def load(self, settings) -> Expecting | None:
        """The file given, else the settings' one if it exists (else, without
        --update-expectations, None: no expectations)."""
        from .. import api
        from ..expectations.entries import Expectations
        from ..expectations.rewrite import refuse_read_only

        path, update = self.path, self.update
        target = Path(path) if path is not None else Path(settings.expectations)
        if update:
            refuse_read_only(target)
        if target.is_file():
            return Expecting(api.load_expectations(target), target, update)
        if target.exists():
            named = (f"--expectations {path}" if path is not None
                     else f"the expectations file {target} ([tool.opdiff])")
            raise OpdiffError(f"{named}: not a regular file (a directory, a pipe or a device?). Give an "
                              "expectations file; to hold a run to none, give an empty file.")
        if path is not None and not update:
            raise OpdiffError(f"--expectations {path}: no such file. Give an existing expectations file, or "
                              "write one from a run with --update-expectations.")
        return Expecting(Expectations([], str(target)), target, True) if update else None


EXPECTATIONS = Group("expecting", (
    click.option("--expectations", "expectations_path", type=click.Path(path_type=Path, dir_okay=False),
                 help="The expectations file: results known not to pass (default: expectations.yaml, or "
                      "`expectations` under [tool.opdiff]; none if that file does not exist)."),
    click.option("--update-expectations", is_flag=True,
                 help="Write this run's failures into the expectations file (keeping reasons written), remove "
                      "entries that pass now, and say what changed; entries of other presets and tests stay."),
), lambda values: ExpectationsFlags(values["expectations_path"], values["update_expectations"]))


# ---------------------------------------------------------------- which part of the history

def history_filter(changes: bool = False) -> Group:
    """-b/--preset, -t/--test, --since, --until (and with `changes`, --version and --host),
    parsed into an analytics HistoryFilter."""
    flags: tuple[Callable, ...] = (
        click.option("-b", "--preset", "presets", multiple=True, help="Only this preset (repeatable)."),
        click.option("-t", "--test", "tests", multiple=True, metavar="GLOB",
                     help="Only test ids matching this glob (repeatable), e.g. 'conv*'."),
        click.option("--since", type=click.DateTime(), help="Only runs started at or after this time (UTC)."),
        click.option("--until", type=click.DateTime(), help="Only runs started at or before this time (UTC)."),
    )
    if changes:
        flags += (
            click.option("--version", "versions", multiple=True, metavar="LIB[==VER]",
                         help="Only changes of this library (torch), or to or from this version (torch==2.14.1); "
                              "repeatable."),
            click.option("--host", "hosts", multiple=True, help="Only runs on this host (repeatable)."),
        )

    def parse(values: dict[str, Any]):
        from ..analytics.steps import HistoryFilter

        return HistoryFilter(tuple(values["presets"]), tuple(values["tests"]), values["since"], values["until"],
                             tuple(values.get("versions", ())), tuple(values.get("hosts", ())))

    return Group("history", flags, parse)


def _step_params(values: dict[str, Any]):
    from ..analytics.steps import StepParams

    return StepParams(**values)


STEP_PARAMS = Group("params", (
    click.option("--min-ratio", type=NON_NEGATIVE, default=1.1, show_default=True,
                 help="A latency step's confidence interval must clear this ratio."),
    click.option("--noise-k", type=NON_NEGATIVE, default=2.0, show_default=True,
                 help="A latency step must exceed this many times the run-to-run noise."),
    click.option("--penalty", type=NON_NEGATIVE, help="Cost of a step in the fit, in noise variances "
                 "(default 3 ln(runs of the series))."),
    click.option("--drift-factor", type=NON_NEGATIVE, default=10.0, show_default=True,
                 help="max_abs growth that counts (x max(before, atol))."),
    click.option("--min-runs", type=int, default=3, show_default=True,
                 help="Runs a latency step with no environment change needs on either side."),
), _step_params)
