"""`opdiff` command line. Each command parses flags and calls one function of the API."""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console

from ..core import limits
from ..core.config import Settings, load_settings, memory_size
from ..core.errors import Interrupted, OpdiffError
from ..core.limits import FlagError, Number
from ..core.safetext import printable
from ..core.verdicts import NOT_FAILING, PRECEDENCE, GoldenState, Verdict
from ..suite.model import Tolerance


def _echo(text: str, err: bool = False) -> None:
    """A line for the terminal: whatever in it came from goldens, the history or a library
    is shown with its control characters escaped (newlines and tabs kept)."""
    click.echo(printable(text, lines=True), err=err)


class Context:
    def __init__(self, debug: bool, settings: Settings):
        self.debug = debug
        self.settings = settings


def guarded(fn):
    """User errors: one paragraph on stderr, exit 2; no traceback unless --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        debug = bool(ctx.find_object(Context) and ctx.find_object(Context).debug)
        try:
            return fn(*args, **kwargs)
        except OpdiffError as exc:
            if debug:
                traceback.print_exc()
            _echo(f"opdiff: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except BrokenPipeError:  # output piped into `head` and the like
            sys.stderr = None
            sys.exit(0)
        except KeyboardInterrupt as exc:
            # a run says what stays of it (history.RunWriter), a query what it stopped; anything else
            # promises nothing
            if isinstance(exc, Interrupted):
                _echo(f"opdiff: {exc}", err=True)
            else:
                _echo(f"opdiff: interrupted; {exc}" if str(exc) else "opdiff: interrupted.", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug of ours or of a library: say so plainly
            if debug:
                traceback.print_exc()
            _echo(f"opdiff: internal error: {type(exc).__name__}: {exc}. Re-run with --debug for the "
                  "traceback and report it; nothing already recorded was changed.", err=True)
            sys.exit(3)

    return wrapper


class UsageProblem(click.ClickException):
    """A command line click could not parse, said as our one paragraph (exit 2)."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"opdiff: error: {self.message}", err=True)


def _usage_message(exc: click.UsageError, command: str) -> str:
    """`FLAG: what is wrong. See `opdiff CMD --help`.`: the flag or argument named by us,
    whatever words click has for the problem itself."""
    if isinstance(exc, FlagError):   # our numeric flags say the flag, the value and the range
        return f"{exc.format_message().rstrip('.')}. See `{command} --help`."
    detail = " ".join((exc.message or "").split())
    param = getattr(exc, "param", None)
    hint = getattr(exc, "param_hint", None)
    if isinstance(exc, click.NoSuchOption):
        near = sorted(exc.possibilities or [])
        where = exc.option_name
        detail = f"`{command}` has no such option" + (f" (did you mean {' or '.join(near)}?)" if near else "")
    elif hint:
        where = hint if isinstance(hint, str) else "/".join(hint)
    elif isinstance(param, click.Option):
        where = "/".join(param.opts)
    elif param is not None:
        where = param.human_readable_name
    else:
        where = getattr(exc, "option_name", None) or ""
    if isinstance(exc, click.MissingParameter):
        detail = "required, but not given"
    text = f"{where}: {detail}" if where else detail
    return f"{text.rstrip('.')}. See `{command} --help`."


class OpdiffGroup(click.Group):
    """Usage errors (an unknown flag, a value a flag's type refuses, a missing argument)
    are one paragraph of ours naming the flag, like every other user error."""

    group_class = type   # subgroups (goldens, report, ...) are OpdiffGroups too

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise _ours(exc, parent) from None

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        ctx.meta["opdiff.command"] = f"{_command_path(ctx)} {name}"   # for errors that carry no context
        return name, cmd, rest

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _ours(exc, ctx) from None


def _command_path(ctx: click.Context | None) -> str:
    """`opdiff goldens show`, whatever name the program was started by."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["opdiff", *reversed(names)])


def _ours(exc: click.UsageError, ctx: click.Context | None) -> click.ClickException:
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
        return exc   # a bare group: its help, as click shows it
    if exc.ctx is not None:
        command = _command_path(exc.ctx)
    else:
        command = ctx.meta.get("opdiff.command", _command_path(ctx)) if ctx is not None else "opdiff"
    return UsageProblem(_usage_message(exc, command))


JOBS = Number(limits.JOBS)
TIMEOUT_S = Number(limits.TIMEOUT_S)
REPEATS = Number(limits.REPEATS)
WARMUP = Number(limits.WARMUP)
SEED_COUNT = Number(limits.SEED_COUNT)
SEED = Number(limits.SEED)
NON_NEGATIVE = Number(limits.NON_NEGATIVE)
POSITIVE = Number(limits.POSITIVE)
ENTRIES = Number(limits.ENTRIES)


class MemorySize(click.ParamType):
    """A memory size flag: '512MB', '2GB', '1.5GiB' (config.memory_size) -> bytes."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return memory_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _output_file(path: Path | None, flag: str) -> Path | None:
    """A file a command is about to write: a directory there is refused before any work."""
    if path is not None and path.is_dir():
        raise OpdiffError(f"{flag} {path} is a directory; give the path of a file to write.")
    return path


def _output_dir(path: Path | None, flag: str) -> Path | None:
    if path is not None and path.exists() and not path.is_dir():
        raise OpdiffError(f"{flag} {path} is a file; give a directory to write into.")
    return path


@contextlib.contextmanager
def _writing(path: Path, flag: str):
    """Turn an OSError while writing `path` into a clear error."""
    try:
        yield
    except OSError as exc:
        raise OpdiffError(f"{flag} {path}: cannot write it ({exc.strerror or exc}).") from None


def _patterns(values: tuple[str, ...]) -> list[str] | None:
    return list(values) or None


def _settings(ctx: click.Context, **overrides) -> Settings:
    found = ctx.find_object(Context)
    assert found is not None, "the main group makes the context"
    return found.settings.with_overrides(**overrides)


def _seed_list(text: str | None) -> list[int] | None:
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


@click.group(cls=OpdiffGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.option("--suites", "suites_dir", type=click.Path(path_type=Path), help="Suites directory (default ./suites).")
@click.option("--goldens", type=click.Path(), help="Golden store (default ./goldens; or s3://bucket/prefix).")
@click.option("--store", type=click.Path(), help="History store (default ./store; or s3://bucket/prefix).")
@click.option("--cache", type=click.Path(), help="Artifact cache (default ./.opdiff-cache; or s3://bucket/prefix).")
@click.option("--s3-endpoint", metavar="URL",
              help="S3-compatible service for s3:// stores (default: AWS, or AWS_ENDPOINT_URL).")
@click.version_option(package_name="opdiff-snap")
@click.pass_context
def main(ctx: click.Context, debug: bool, suites_dir, goldens, store, cache, s3_endpoint) -> None:
    """Golden-file regression store for PyTorch ops and modules across backends.

    \b
    record   suites/ -> goldens/ on a baseline preset
    check    goldens/ -> verdicts -> store/ on target presets
    query    SQL over the history in store/
    """
    from ..core.config import apply_endpoint

    try:
        settings = load_settings().with_overrides(suites=suites_dir, goldens=goldens, store=store, cache=cache,
                                                  s3_endpoint=s3_endpoint)
    except OpdiffError as exc:
        _echo(f"opdiff: error: {exc}", err=True)
        sys.exit(2)
    apply_endpoint(settings)
    ctx.obj = Context(debug, settings)


def _executor_option(fn):
    """--executor on every command that runs jobs: where they run (kept in the settings)."""

    def keep(ctx: click.Context, param, value):
        if value is not None:
            from ..core.config import parse_executor

            try:
                parse_executor(value)
            except OpdiffError as exc:
                raise click.BadParameter(str(exc).removeprefix(f"--executor {value!r}: ")) from None
            found = ctx.find_object(Context)
            assert found is not None, "the main group makes the context"
            found.settings = found.settings.with_overrides(executor=value)
        return value

    return click.option("--executor", metavar="local|ray|ray://HOST:PORT", expose_value=False, callback=keep,
                        help="Where jobs run: worker processes here (local, the default), a Ray instance "
                             "started here (ray), or the Ray cluster whose head is at HOST:PORT, each job on "
                             "a node with the hardware its preset needs (docs/distributed.md).")(fn)


def _python_option(fn):
    """--python on every command that runs jobs in local workers: the interpreter they run under."""
    return click.option("--python", "python", type=click.Path(path_type=Path),
                        help="Run the workers under this interpreter (another venv, conda or uv environment): "
                             "its packages run the jobs; suites, goldens, tolerances and the store stay "
                             "these.")(fn)


# ---------------------------------------------------------------- suites and presets

@main.command("list-presets")
@guarded
def list_presets() -> None:
    """Every preset, and whether it can export and run on this machine."""
    from .. import api
    from .output import presets_table

    Console().print(presets_table(api.presets()))


@main.command("list-tests")
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable.")
@click.option("--tags", multiple=True, help="Only tests with this tag; repeatable.")
@click.option("--long", "long_", is_flag=True, help="Also show type, seeds, tags and spec hash.")
@click.pass_context
@guarded
def list_tests(ctx, suites, test_ids, tags, long_) -> None:
    """Expanded test ids of SUITES (default: every suite under ./suites), in order."""
    from .. import api

    for case in api.list_tests([Path(s) for s in suites] or None, test_ids=_patterns(test_ids),
                               tags=_patterns(tags), settings=_settings(ctx)):
        if long_:
            _echo(f"{case.id}\t{case.test_type}\tseeds={list(case.seeds)}\t"
                  f"tags={','.join(case.tags)}\t{case.spec_hash[:12]}")
        else:
            _echo(case.id)


@main.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--imports", is_flag=True,
              help="Also import every user path (file: modules, packages) in a worker process.")
@click.option("--timeout-s", type=TIMEOUT_S, help="Per-import timeout in seconds.")
@_python_option
@_executor_option
@click.pass_context
@guarded
def validate(ctx, suites, imports, timeout_s, python) -> None:
    """Load and validate SUITES; report every problem at once (exit 2 if any).

    Paths are found without running the suite's code; what cannot be settled that way
    (and, with --imports, every user path) is imported in a worker process."""
    from .. import api

    cases = api.validate([Path(s) for s in suites] or None, imports=imports,
                         settings=_settings(ctx, timeout_s=timeout_s), python=python)
    _echo(f"ok: {len(cases)} tests")


# ---------------------------------------------------------------- record / check

def _apply(fn, options: list):
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def _jobs_and_selection(fn):
    """How jobs run and which (test, seed) pairs: shared by record, check and upgrade."""
    return _apply(fn, [
        click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores)."),
        click.option("--timeout-s", type=TIMEOUT_S, help="Per-job timeout in seconds (>= 0.1)."),
        click.option("--repeats", type=REPEATS, help="Timed calls per job (median reported)."),
        click.option("--warmup", type=WARMUP, help="Untimed warm-up calls per job."),
        click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable."),
        click.option("--tags", multiple=True, help="Only tests with this tag; repeatable."),
        click.option("--seeds", type=SEED_COUNT, help="Use seeds 0..N-1 instead of each test's."),
        click.option("--seed-list", help="Use exactly these seeds, e.g. 0,3,7."),
    ])


def _run_options(fn):
    return _jobs_and_selection(_apply(fn, [
        click.option("--in-process", is_flag=True, help="Run jobs in this process (debugging; no isolation)."),
        click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text"),
        click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too."),
    ]))


def _opdiff_options(fn):
    """opdiff's own flags, so its users' commands keep working (see README, Coming from opdiff)."""
    for opt in reversed([
        click.option("--backends", "opdiff_backends", metavar="'A;B'",
                     help="opdiff's form of -b: ';'-separated presets."),
        click.option("--skips", "opdiff_skips", metavar="'ID:PRESET;...'",
                     help="Skip these (test id or prefix*, preset or glob) pairs: SKIPPED with the reason."),
        click.option("--backend-overrides-file", type=click.Path(path_type=Path),
                     help="opdiff's per-preset options file (JSON or YAML: {preset: {options}})."),
        click.option("--backend-overrides-json", help="opdiff's per-preset options as inline JSON."),
        click.option("--num-sampled-inputs", type=SEED_COUNT, help="opdiff's name for --seeds."),
    ]):
        fn = opt(fn)
    return fn


def _parse_skips(text: str | None) -> list[tuple[str, str]]:
    out = []
    for token in (t.strip() for t in (text or "").split(";")):
        if not token:
            continue
        tid, sep, preset = (part.strip() for part in token.partition(":"))
        if not sep or not tid or not preset:
            raise OpdiffError(f"--skips '{token}': write TEST_ID:PRESET pairs separated by ';', e.g. "
                              "'conv_*:onnx_cpu_fp16;gelu:*'.")
        out.append((tid, preset))
    return out


def _overrides_source(file: Path | None, inline: str | None):
    """opdiff's --backend-overrides-file/-json as what get_preset accepts (None if absent)."""
    if file is not None and inline is not None:
        raise OpdiffError("give --backend-overrides-file or --backend-overrides-json, not both.")
    if inline is not None:
        return inline
    if file is None:
        return None
    if file.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise OpdiffError(f"--backend-overrides-file {file}: cannot read it as YAML ({exc}).") from None
        return data if data is not None else {}
    return str(file)


def _run_and_report(ctx, runner, fmt, verbose, fail_on_text, junit, label):
    from .output import ProgressDisplay, exit_code, make_console, parse_fail_on, print_summary, report_json, write_junit

    fail_on = parse_fail_on(fail_on_text)
    _output_file(Path(junit) if junit else None, "--junit")
    console = make_console(sys.stderr if fmt == "json" else sys.stdout)
    with ProgressDisplay(console, None, label, verbose) as progress:
        report = runner(progress)
    if fmt == "json":
        _echo(report_json(report))
    else:
        print_summary(console, report)
    if junit:
        try:
            write_junit(report, Path(junit), fail_on)
        except OSError as exc:
            raise OpdiffError(f"--junit {junit}: cannot write it ({exc.strerror}); the run itself is in "
                              f"{report.path}.") from None
    sys.exit(exit_code(report.results, fail_on))


@main.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--baseline", default="torch_cpu_fp32", show_default=True, help="Preset that computes the goldens.")
@click.option("--preset-options", help="JSON (string or file) overriding the baseline preset's options.")
@click.option("--force", is_flag=True, help="Re-record goldens that are up to date too.")
@click.option("--fail-on", help="Verdicts that make the exit code 1 (default: BASELINE_FAIL and the like).")
@click.option("--junit", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@_run_options
@_opdiff_options
@_executor_option
@click.pass_context
@guarded
def record(ctx, suites, baseline, preset_options, force, fail_on, junit, jobs, timeout_s, repeats, warmup,
           in_process, test_ids, tags, seeds, seed_list, fmt, verbose, opdiff_backends, opdiff_skips,
           backend_overrides_file, backend_overrides_json, num_sampled_inputs) -> None:
    """Record goldens: run the baseline on seeded inputs and store inputs, weights and outputs.

    With no SUITES, records every suite under ./suites. Writes only missing or stale
    goldens unless --force."""
    from .. import api

    if opdiff_backends:
        names = [n.strip() for n in opdiff_backends.split(";") if n.strip()]
        if len(names) != 1:
            raise OpdiffError(f"--backends '{opdiff_backends}': record runs one baseline; give it as "
                              "--baseline PRESET, then `opdiff check -b ...` for the targets.")
        baseline = names[0]
    overrides = _overrides_source(backend_overrides_file, backend_overrides_json)
    if overrides is not None:
        if preset_options:
            raise OpdiffError("give --preset-options or opdiff's --backend-overrides-*, not both.")
        preset_options = overrides
    seeds = _opdiff_seeds(seeds, num_sampled_inputs)
    settings = _settings(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup)
    _run_and_report(ctx, lambda listener: api.record(
        list(suites) or None, baseline=baseline, preset_options=preset_options, seeds=seeds,
        seed_list=_seed_list(seed_list), test_ids=_patterns(test_ids), tags=_patterns(tags), force=force,
        skips=_parse_skips(opdiff_skips), in_process=in_process, settings=settings, argv=sys.argv[1:],
        listener=listener),
        fmt, verbose, fail_on, junit, f"record {baseline}")


def _opdiff_seeds(seeds: int | None, num_sampled_inputs: int | None) -> int | None:
    if num_sampled_inputs is not None and seeds is not None and seeds != num_sampled_inputs:
        raise OpdiffError(f"--seeds {seeds} and --num-sampled-inputs {num_sampled_inputs} disagree; give one.")
    return seeds if seeds is not None else num_sampled_inputs


def _preset_options(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, body = value.partition("=")
        if not sep or not name or not body:
            raise OpdiffError(f"--preset-options '{value}': write PRESET=JSON or PRESET=path/to/options.json, "
                              "e.g. onnx_cpu_fp32='{\"opset\": 18}'.")
        out[name] = body
    return out


@main.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("-b", "--backend", "backends", multiple=True,
              help="Target preset; repeatable (see `opdiff list-presets`).")
@click.option("--preset-options", multiple=True, help="PRESET=JSON (string or file path); repeatable.")
@click.option("--atol", type=NON_NEGATIVE, help="Override the absolute tolerance for every comparison.")
@click.option("--rtol", type=NON_NEGATIVE, help="Override the relative tolerance for every comparison.")
@click.option("--baseline-factor", type=NON_NEGATIVE,
              help="Times the baseline's own rounding error a result may differ by (default 4; 0: off).")
@click.option("--resume", "resume", metavar="RUN_ID", help="Finish an interrupted run (see `opdiff runs`).")
@click.option("--no-cache", is_flag=True, help="Re-export even when a cached artifact exists.")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@click.option("--fail-on", help="Comma-separated verdicts that make the exit code 1 (default: all but "
                                + ", ".join(v.value for v in reversed(PRECEDENCE) if v in NOT_FAILING) + ").")
@click.option("--junit", type=click.Path(path_type=Path), help="Also write JUnit XML here.")
@_python_option
@click.option("--shard", metavar="K/N", callback=lambda ctx, param, value: _shard(value, ctx, param),
              help="Run the K-th of N shards of the planned jobs (with --run-group).")
@click.option("--run-group", metavar="ID", help="Logical run this run belongs to (the N shards share it).")
@_run_options
@_opdiff_options
@_executor_option
@click.pass_context
@guarded
def check(ctx, suites, backends, preset_options, atol, rtol, baseline_factor, resume, no_cache, trust_goldens,
          fail_on, junit, python, shard, run_group, jobs,
          timeout_s, repeats, warmup, in_process, test_ids, tags, seeds, seed_list, fmt, verbose,
          opdiff_backends, opdiff_skips, backend_overrides_file, backend_overrides_json,
          num_sampled_inputs) -> None:
    """Check goldens on target presets: exactly the stored inputs and weights, compared
    with tolerances; one JSONL history file per run in ./store.

    Exit 0 when nothing failed, 1 when a --fail-on verdict occurred, 2 on input errors."""
    from .. import api

    backends = list(backends) + [n.strip() for n in (opdiff_backends or "").split(";") if n.strip()]
    if not backends:
        raise OpdiffError("check needs a target: -b PRESET (repeatable) or --backends 'A;B' "
                          "(see `opdiff list-presets`).")
    options = _preset_options(preset_options)
    overrides = _overrides_source(backend_overrides_file, backend_overrides_json)
    if overrides is not None:
        if options:
            raise OpdiffError("give --preset-options or opdiff's --backend-overrides-*, not both.")
        options = {name: overrides for name in backends}
    seeds = _opdiff_seeds(seeds, num_sampled_inputs)
    given = (atol, rtol, baseline_factor)
    tol = Tolerance(*given) if any(v is not None for v in given) else None
    settings = _settings(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup)
    _run_and_report(ctx, lambda listener: api.check(
        list(suites) or None, backends=backends, preset_options=options,
        seeds=seeds, seed_list=_seed_list(seed_list), test_ids=_patterns(test_ids), tags=_patterns(tags),
        skips=_parse_skips(opdiff_skips), tolerance=tol, resume=resume, in_process=in_process,
        use_cache=not no_cache, trust_goldens=trust_goldens, settings=settings,
        argv=sys.argv[1:], listener=listener, python=python, shard=shard,
        run_group=run_group),
        fmt, verbose, fail_on, junit, "check" if not shard else f"check shard {shard[0]}/{shard[1]}")


def _shard(text: str | None, ctx: click.Context, param: click.Parameter) -> tuple[int, int] | None:
    """--shard K/N, read when the flags are parsed."""
    from ..history.sharding import parse_shard

    try:
        return parse_shard(text) if text else None
    except OpdiffError as exc:
        raise FlagError(str(exc).removeprefix(f"--shard {text!r}: "), text, ctx, param) from None


@main.command()
@click.option("--restore", is_flag=True,
              help="A remote store lacks runs this machine's mirror of it has: upload them back.")
@click.option("--accept-store", is_flag=True,
              help="A remote store lacks runs this machine's mirror of it has: take the store as it is "
                   "(the mirror's copies are moved aside, not deleted).")
@click.pass_context
@guarded
def runs(ctx, restore, accept_store) -> None:
    """Runs in the history store, newest last; incomplete ones can be --resume'd. The runs
    of a --run-group (the shards of one check) are summed up as one logical run below."""
    from .. import api
    from .output import run_groups_table, runs_table

    if restore and accept_store:
        raise OpdiffError("--restore and --accept-store are opposites; give one of them.")
    if restore or accept_store:
        click.echo(api.reconcile_history(_settings(ctx), "restore" if restore else "accept"))
    runs = api.runs(_settings(ctx))
    Console().print(runs_table(runs))
    groups = api.run_groups(runs)
    if groups:
        Console().print(run_groups_table(groups))


# ---------------------------------------------------------------- goldens

@main.group()
def goldens() -> None:
    """Inspect and maintain the golden store."""


@goldens.command("ls")
@click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable.")
@click.pass_context
@guarded
def goldens_ls(ctx, test_ids) -> None:
    """Every golden: test, seeds, baseline, recorded with which versions, stale or not."""
    from .. import api
    from .output import goldens_table

    settings = _settings(ctx)
    rows = api.goldens(settings, _patterns(test_ids))
    Console().print(goldens_table(rows))
    _echo(f"{sum(len(r.infos) for r in rows)} goldens of {len(rows)} tests in {settings.goldens}")


@goldens.command("show")
@click.argument("test_id")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.pass_context
@guarded
def goldens_show(ctx, test_id, seed) -> None:
    """Inputs, parameters and outputs of one golden (shapes, dtypes, value summaries) and its metadata."""
    from .. import api
    from .output import describe_golden

    describe_golden(Console(), api.golden(test_id, seed, _settings(ctx)))


@goldens.command("prune")
@click.option("--yes", is_flag=True, help="Really delete; without it, only list what would go.")
@click.pass_context
@guarded
def goldens_prune(ctx, yes) -> None:
    """Remove goldens whose tests no longer exist in the suites (dry run unless --yes)."""
    from .. import api

    orphans = api.prune(_settings(ctx), delete=yes)
    for info in orphans:
        _echo(f"{'deleted' if yes else 'would delete'} {info.test_id} seed={info.seed}")
    _echo(f"{len(orphans)} orphaned goldens{'' if yes else ' (dry run; --yes deletes them)'}")


@goldens.command("reference")
@click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable.")
@click.option("--force", is_flag=True, help="Measure goldens that already have a reference again.")
@click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores).")
@click.option("--in-process", is_flag=True, help="Run in this process (debugging; no isolation).")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@_executor_option
@click.pass_context
@guarded
def goldens_reference(ctx, test_ids, force, jobs, in_process, trust_goldens) -> None:
    """Add a float64 reference to goldens recorded without one, keeping their outputs.

    Each golden runs in float64 on its stored inputs and weights; the difference to its
    stored outputs is the baseline's own rounding error, which check then allows for."""
    from .. import api

    results = api.add_references(None, test_ids=_patterns(test_ids), force=force, in_process=in_process,
                                 trust_goldens=trust_goldens, settings=_settings(ctx, jobs=jobs))
    counts: dict[Verdict, int] = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
        if r.verdict is Verdict.BASELINE_FAIL or (r.verdict is Verdict.RECORDED and "added" not in r.message):
            _echo(f"{r.verdict.value} {r.test_id} seed={r.seed}: {r.message}")
    _echo(f"{counts.get(Verdict.RECORDED, 0)} goldens measured, {counts.get(Verdict.KEPT, 0)} already had a "
          f"reference, {counts.get(Verdict.BASELINE_FAIL, 0)} could not be rebuilt")
    sys.exit(1 if counts.get(Verdict.BASELINE_FAIL) else 0)


@goldens.command("verify")
@click.pass_context
@guarded
def goldens_verify(ctx) -> None:
    """Check every golden as check reads it; exit 1 if any is corrupt or stale, 2 if there
    is no golden to check.

    Checksums, metadata, tensor records, the structures that refer to tensors, and the
    stored definition (it must rebuild into a test whose spec hash is the stored one;
    UNCHECKED when a file: module it names is not found from here)."""
    from .. import api

    findings, n = api.verify(_settings(ctx))
    for f in findings:
        _echo(f"{f.kind} {f.info.test_id} seed={f.info.seed}: {f.message}")
    corrupt, stale, unchecked = (len({f.info.key for f in findings if f.kind is kind})
                                 for kind in (GoldenState.CORRUPT, GoldenState.STALE, GoldenState.UNCHECKED))
    _echo(f"{n} goldens checked, {corrupt} corrupt" + (f", {stale} stale" if stale else "")
          + (f", {unchecked} with a spec hash not checked from here" if unchecked else ""))
    sys.exit(1 if corrupt or stale else 0)


# ---------------------------------------------------------------- analytics

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "markdown"]),
                             default="table", show_default=True)


def _runs_to_compare(f):
    """RUN_A RUN_B, or --by LIB [--versions A B]: which two runs a diff compares."""
    f = click.option("--versions", nargs=2, help="With --by: the two versions (default: the two latest).")(f)
    f = click.option("--by", help="Compare the latest runs on two versions of this library instead of run ids.")(f)
    f = click.argument("run_b", required=False)(f)
    return click.argument("run_a", required=False)(f)


def _diff_thresholds(f):
    """What counts as drift and as a latency change in a diff."""
    f = click.option("--latency-threshold", type=NON_NEGATIVE, default=0.25, show_default=True,
                     help="Relative latency change that counts (never below 3x the repeat spread).")(f)
    return click.option("--drift-factor", type=POSITIVE, default=10.0, show_default=True,
                        help="max_abs growth that counts as drift.")(f)


def _query_limits(f):
    """--timeout-s and --memory-limit of the commands that run SQL over the history: they
    override query-timeout-s and query-memory-limit of the settings for this command."""

    @functools.wraps(f)
    def wrapper(*args, query_timeout_s=None, query_memory_limit=None, **kwargs):
        found = click.get_current_context().find_object(Context)
        assert found is not None, "the main group makes the context"
        found.settings = found.settings.with_overrides(query_timeout_s=query_timeout_s,
                                                       query_memory_limit=query_memory_limit)
        return f(*args, **kwargs)

    wrapper = click.option("--memory-limit", "query_memory_limit", type=MemorySize(), metavar="SIZE",
                           help="Memory the SQL may use, e.g. 2GB (default: half of this machine's; "
                                "query-memory-limit in [tool.opdiff]).")(wrapper)
    return click.option("--timeout-s", "query_timeout_s", type=TIMEOUT_S,
                        help="Time limit of each SQL statement over the history, in seconds (default 300; "
                             "query-timeout-s in [tool.opdiff]); Ctrl-C stops one too.")(wrapper)


def _print_table(table, fmt: str, title: str | None = None) -> None:
    from ..analytics import format_table

    if title and fmt in ("table", "markdown"):
        _echo(f"\n{title}")
    _echo(format_table(table, fmt))


def _warn(text: str) -> None:
    _echo(f"opdiff: warning: {text}", err=True)


@main.command()
@click.argument("sql", required=False)
@click.option("--schema", is_flag=True, help="Print the views (and the verdicts table) and their columns "
                                             "with their meaning.")
@FORMAT_OPTION
@_query_limits
@click.pass_context
@guarded
def query(ctx, sql, schema, fmt) -> None:
    """Read-only SQL over the history: views `runs` and `results`, and the `verdicts` table
    with the verdict_* macros (see --schema).

    \b
    opdiff query "SELECT preset, status, count(*) FROM results GROUP BY ALL ORDER BY ALL"
    """
    from .. import api
    from ..analytics import Table

    if schema:
        _print_table(Table(["view", "column", "type", "meaning"], api.schema(_settings(ctx), _warn)), fmt)
        return
    if not sql:
        raise OpdiffError("query needs SQL (or --schema to see the views), e.g. "
                          "opdiff query \"SELECT * FROM runs\".")
    _print_table(api.query(sql, _settings(ctx), _warn), fmt)


@main.group()
def report() -> None:
    """Canned reports over the history."""


@report.command("support")
@click.option("--by", help="Columns per version of this library (torch, executorch, onnxruntime, coremltools).")
@FORMAT_OPTION
@click.option("--png", type=click.Path(path_type=Path), help="Also draw the heatmap to this PNG.")
@_query_limits
@click.pass_context
@guarded
def report_support(ctx, by, fmt, png) -> None:
    """Tests x presets, the latest verdict of each."""
    from .. import api

    _output_file(png, "--png")
    table = api.support(_settings(ctx), by, _warn)
    _print_table(table, fmt)
    if png:
        from ..analytics.plots import support_heatmap

        with _writing(png, "--png"):
            _echo(f"wrote {support_heatmap(table, png)}", err=True)


@report.command("latency")
@click.option("--baseline", help="Preset to divide by (default: the runs' baseline).")
@FORMAT_OPTION
@click.option("--png-dir", type=click.Path(path_type=Path), help="Also draw the ratio CDF and trends here.")
@_query_limits
@click.pass_context
@guarded
def report_latency(ctx, baseline, fmt, png_dir) -> None:
    """Per preset: median latency ratio against the baseline, and the trend across runs."""
    from .. import api

    _output_dir(png_dir, "--png-dir")
    rep = api.latency(_settings(ctx), baseline, _warn)
    _print_table(rep.ratios, fmt, f"latency ratio against {rep.baseline}")
    _print_table(rep.trend, fmt, "median inference latency per run")
    if png_dir:
        from ..analytics.plots import latency_cdf, latency_trend_plot

        with _writing(png_dir, "--png-dir"):
            png_dir.mkdir(parents=True, exist_ok=True)
            _echo(f"wrote {latency_cdf(rep, png_dir / 'latency_cdf.png')}, "
                  f"{latency_trend_plot(rep.trend, png_dir / 'latency_trend.png')}", err=True)


@report.command("html")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True)
@_query_limits
@click.pass_context
@guarded
def report_html(ctx, output) -> None:
    """One self-contained HTML file: summary, support heatmap and matrix, latency, regressions."""
    from .. import api

    _output_file(output, "-o/--output")
    with _writing(output, "-o/--output"):
        _echo(f"wrote {api.html_report(output, _settings(ctx))}")


@report.command("upgrade")
@_runs_to_compare
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("upgrade.html"), show_default=True)
@_diff_thresholds
@_query_limits
@click.pass_context
@guarded
def report_upgrade(ctx, run_a, run_b, by, versions, output, drift_factor, latency_threshold) -> None:
    """diff-runs A B (or --by LIB) as one self-contained HTML page, with the latency ratio per op family."""
    from .. import api

    _output_file(output, "-o/--output")
    with _writing(output, "-o/--output"):
        path = api.diff_page(output, run_a, run_b, by=by, versions=tuple(versions) if versions else None,
                             drift_factor=drift_factor, latency_threshold=latency_threshold,
                             settings=_settings(ctx), warn=_warn)
    _echo(f"wrote {path}")


@main.command("diff-runs")
@_runs_to_compare
@_diff_thresholds
@FORMAT_OPTION
@_query_limits
@click.pass_context
@guarded
def diff_runs(ctx, run_a, run_b, by, versions, drift_factor, latency_threshold, fmt) -> None:
    """Newly failing, newly passing, drifted metrics and latency changes from A to B."""
    from .. import api

    diff = api.diff_runs(run_a, run_b, by=by, versions=tuple(versions) if versions else None,
                         drift_factor=drift_factor, latency_threshold=latency_threshold,
                         settings=_settings(ctx), warn=_warn)
    for title, table in diff.sections():
        _print_table(table, fmt, f"{title} ({len(table)})")
    _echo(diff.summary())
    sys.exit(1 if len(diff.newly_failing) else 0)


def _requirements(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--with values, each refused at parse time unless it is an exact NAME==VERSION pin."""
    from ..execution.workerenvs import parse_requirement

    for value in values:
        try:
            parse_requirement(value)
        except OpdiffError as exc:
            raise FlagError(str(exc).removeprefix(f"--with {value!r}: "), value, ctx, param) from None
    return values


class _UpgradeUI:
    """Shows `opdiff upgrade` as it goes: installer lines, then each check's progress."""

    def __init__(self, console, verbose: bool):
        self.console, self.verbose = console, verbose

    def installing(self, line: str) -> None:
        self.console.print(f"  | {printable(line)}", highlight=False, markup=False, soft_wrap=True)

    def check(self, label: str):
        from .output import ProgressDisplay

        self.console.print(f"== {printable(label)}", highlight=False, markup=False, soft_wrap=True)
        return ProgressDisplay(self.console, None, label, self.verbose)

    def reused(self, run_id: str) -> None:
        self.console.print(f"== check here: reusing run {printable(run_id)} (same plan, same versions, newer than "
                           "every golden; --rerun-current runs it again)", highlight=False, markup=False,
                           soft_wrap=True)


@main.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--with", "withs", multiple=True, metavar="PKG==VER", callback=_requirements,
              help="A package version for the other environment; repeatable.")
@click.option("-b", "--backend", "backends", multiple=True, help="Target preset; repeatable.")
@click.option("--preset-options", multiple=True, help="PRESET=JSON (string or file path); repeatable.")
@click.option("--rerun-current", is_flag=True, help="Check this environment again even when a fresh run exists.")
@click.option("--html", type=click.Path(path_type=Path), help="Also write the comparison as one HTML page.")
@_diff_thresholds
@_jobs_and_selection
@FORMAT_OPTION
@click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too.")
@click.pass_context
@guarded
def upgrade(ctx, suites, withs, backends, preset_options, rerun_current, html, drift_factor, latency_threshold,
            jobs, timeout_s, repeats, warmup, test_ids, tags, seeds, seed_list, fmt, verbose) -> None:
    """Check the goldens in an environment with --with packages replaced, and here; diff the two.

    \b
    opdiff upgrade --with onnxruntime==1.30.0 -b onnx_cpu_fp32
    The environment (this one's pins, the named packages replaced) is built with uv or
    venv + pip under the cache dir and reused by later upgrades with the same requirements.
    Exit 1 when something passes here and not there."""
    from .. import api
    from .output import make_console

    _output_file(html, "--html")
    console = make_console(sys.stderr if fmt in ("csv", "json") else sys.stdout)
    settings = _settings(ctx, jobs=jobs, timeout_s=timeout_s, repeats=repeats, warmup=warmup)
    rep = api.upgrade(list(withs), backends=list(backends), suites=list(suites) or None,
                      preset_options=_preset_options(preset_options), test_ids=_patterns(test_ids),
                      tags=_patterns(tags), seeds=seeds, seed_list=_seed_list(seed_list), settings=settings,
                      argv=sys.argv[1:], rerun_current=rerun_current, drift_factor=drift_factor,
                      latency_threshold=latency_threshold, ui=_UpgradeUI(console, verbose))
    how = "reused" if rep.env.reused else f"built with {rep.env.installer}"
    _echo(f"\nenvironment {rep.env.root} ({how} in {rep.env.seconds:.1f} s)", err=fmt in ("csv", "json"))
    for title, table in rep.diff.sections():
        _print_table(table, fmt, f"{title} ({len(table)})")
    _echo(rep.diff.summary(), err=fmt in ("csv", "json"))
    if html:
        with _writing(html, "--html"):
            _echo(f"wrote {api.write_diff_page(rep.diff, html)}")
    sys.exit(1 if len(rep.diff.newly_failing) else 0)


# ---------------------------------------------------------------- finding the cause

@main.command()
@click.argument("test_id")
@click.option("-b", "--backend", required=True, help="Target preset.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--ops", is_flag=True,
              help="Descend to ATen nodes even when a leaf submodule diverges (they are searched anyway "
                   "when none does).")
@click.option("--preset-options", help="JSON (string or file) overriding the preset's options.")
@click.option("--atol", type=NON_NEGATIVE, help="Override the absolute tolerance, as for check.")
@click.option("--rtol", type=NON_NEGATIVE, help="Override the relative tolerance, as for check.")
@click.option("--baseline-factor", type=NON_NEGATIVE,
              help="Override how many times the baseline's own rounding error is allowed (0: none), as for check.")
@click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores).")
@click.option("--timeout-s", type=TIMEOUT_S, help="Per-job timeout in seconds (>= 0.1).")
@click.option("--in-process", is_flag=True, help="Run the jobs in this process (debugging; no isolation).")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@_python_option
@_executor_option
@click.pass_context
@guarded
def localize(ctx, test_id, backend, seed, ops, preset_options, atol, rtol, baseline_factor, jobs, timeout_s,
             in_process, trust_goldens, python) -> None:
    """Where a module test first diverges on BACKEND: submodule, then ATen node.

    Every leaf submodule runs alone on the target with the baseline's captured inputs.
    When none diverges (or with --ops), the smallest divergent scope is exported to ATen
    and each node runs alone the same way; where only a chain of nodes diverges, the
    shortest such range is bisected out. Each piece runs in an isolated worker (a crash is
    a CRASH at that piece). Exit 1 when something diverges."""
    from .. import api
    from ..cause.localize import format_report

    given = (atol, rtol, baseline_factor)
    report = api.localize(test_id, backend, seed=seed, preset_options=preset_options, ops=ops,
                          tolerance=Tolerance(*given) if any(v is not None for v in given) else None,
                          goldens=_settings(ctx).goldens, settings=_settings(ctx, jobs=jobs, timeout_s=timeout_s),
                          in_process=in_process, trust_goldens=trust_goldens, python=python)
    _echo(format_report(report))
    sys.exit(1 if report.found else 0)


@main.command()
@click.argument("test_id")
@click.option("-b", "--backend", required=True, help="Target preset.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Script path (default repro_<test>_<preset>.py).")
@click.option("--node", help="ATen node N, or nodes N-M, of the scope (as `opdiff localize` names them): "
                             "reproduce that op alone, on the intermediate values the baseline computes for it.")
@click.option("--scope", default="", help="With --node: the submodule whose ATen graph holds the node "
                                          "('name' or 'name#K' for its K-th call; default: the module itself).")
@click.option("--preset-options", help="JSON (string or file) overriding the preset's options.")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@click.pass_context
@guarded
def repro(ctx, test_id, backend, seed, output, node, scope, preset_options, trust_goldens) -> None:
    """Write a standalone script (torch + the backend's runtime only) that reproduces a result."""
    import re

    from .. import api

    suffix = f"_node{node.strip()}" if node else ""
    out = output or Path(f"repro_{re.sub(r'[^A-Za-z0-9_]+', '_', test_id)[:80]}_{backend}{suffix}.py")
    _output_file(out, "-o/--output")
    with _writing(out, "-o/--output"):
        path = api.repro(test_id, backend, out, seed=seed, preset_options=preset_options,
                         goldens=_settings(ctx).goldens, trust_goldens=trust_goldens, node=node, scope=scope,
                         timeout_s=_settings(ctx).timeout_s, suites=_settings(ctx).suites)
    _echo(f"wrote {path}; run: python {path}")


@main.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--test-ids", multiple=True, help="Check these tests even without `grad: true`.")
@click.option("--tags", multiple=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--eps", type=POSITIVE, default=1e-6, show_default=True, help="Finite-difference step.")
@click.option("--max-entries", type=ENTRIES, default=32, show_default=True,
              help="Entries perturbed per tensor (a seeded sample beyond this).")
@click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores).")
@click.option("--timeout-s", type=TIMEOUT_S, help="Per-test timeout in seconds (>= 0.1).")
@_python_option
@_executor_option
@click.pass_context
@guarded
def gradcheck(ctx, suites, test_ids, tags, seed, eps, max_entries, jobs, timeout_s, python) -> None:
    """Autograd against central finite differences in float64 on the baseline; exit 1 on a mismatch."""
    from .. import api

    reports = api.gradcheck(list(suites) or None, test_ids=_patterns(test_ids), tags=_patterns(tags),
                            seed=seed, eps=eps, max_entries=max_entries,
                            settings=_settings(ctx, jobs=jobs, timeout_s=timeout_s), python=python)
    for rep in reports:
        _echo(rep.format())
    failed = [r.test_id for r in reports if not r.passed]
    _echo(f"{len(reports) - len(failed)} of {len(reports)} tests pass gradcheck"
          + (f"; failing: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)

