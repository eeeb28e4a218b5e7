"""The `opdiff` group and what its commands share: errors framed as ours, the settings,
flag types, option sets and output helpers."""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from pathlib import Path

import click

from ..core import limits
from ..core.config import Settings, load_settings
from ..core.errors import Interrupted, OpdiffError
from ..core.limits import FlagError, Number
from ..core.regular_files import output_path
from ..core.safetext import printable


def echo(text: str, err: bool = False) -> None:
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
            echo(f"opdiff: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except BrokenPipeError:  # output piped into `head` and the like
            sys.stderr = None
            sys.exit(0)
        except KeyboardInterrupt as exc:
            # a run says what stays of it (history.RunWriter), a query what it stopped; anything else
            # promises nothing
            if isinstance(exc, Interrupted):
                echo(f"opdiff: {exc}", err=True)
            else:
                echo(f"opdiff: interrupted; {exc}" if str(exc) else "opdiff: interrupted.", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug of ours or of a library: say so plainly
            if debug:
                traceback.print_exc()
            echo(f"opdiff: internal error: {type(exc).__name__}: {exc}. Re-run with --debug for the "
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
SEED = Number(limits.SEED)
NON_NEGATIVE = Number(limits.NON_NEGATIVE)
POSITIVE = Number(limits.POSITIVE)


def output_file(path: Path | None, flag: str) -> Path | None:
    """A file a command is about to write: anything there but a regular file (a folder, a
    FIFO, a device) is refused before any work (core/regular_files.py)."""
    return output_path(path, flag)


@contextlib.contextmanager
def writing(path: Path, flag: str):
    """Turn an OSError while writing `path` into a clear error."""
    try:
        yield
    except OSError as exc:
        raise OpdiffError(f"{flag} {path}: cannot write it ({exc.strerror or exc}).") from None


def patterns(values: tuple[str, ...]) -> list[str] | None:
    return list(values) or None


def settings_of(ctx: click.Context, **overrides) -> Settings:
    found = ctx.find_object(Context)
    assert found is not None, "the main group makes the context"
    return found.settings.with_overrides(**overrides)


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
        echo(f"opdiff: error: {exc}", err=True)
        sys.exit(2)
    apply_endpoint(settings)
    ctx.obj = Context(debug, settings)


def executor_option(fn):
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


def python_option(fn):
    """--python on every command that runs jobs in local workers: the interpreter they run under."""
    return click.option("--python", "python", type=click.Path(path_type=Path),
                        help="Run the workers under this interpreter (another venv, conda or uv environment): "
                             "its packages run the jobs; suites, goldens, tolerances and the store stay "
                             "these.")(fn)


FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "markdown"]),
                             default="table", show_default=True)


def diff_thresholds(f):
    """What counts as drift and as a latency change in a diff."""
    f = click.option("--latency-threshold", type=NON_NEGATIVE, default=0.25, show_default=True,
                     help="Relative latency change that counts (never below 3x the repeat spread).")(f)
    return click.option("--drift-factor", type=POSITIVE, default=10.0, show_default=True,
                        help="max_abs growth that counts as drift.")(f)


def print_table(table, fmt: str, title: str | None = None) -> None:
    from ..analytics import format_table

    if title and fmt in ("table", "markdown"):
        echo(f"\n{title}")
    echo(format_table(table, fmt))
