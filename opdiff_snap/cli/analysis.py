"""The history read back: runs, query, report, diff-runs."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click
from rich.console import Console

from ..core.config import memory_size
from ..core.errors import OpdiffError
from .app import (
    FORMAT_OPTION,
    TIMEOUT_S,
    Context,
    OpdiffGroup,
    diff_thresholds,
    echo,
    guarded,
    output_file,
    print_table,
    settings_of,
    writing,
)
from .option_groups import STEP_PARAMS, history_filter, uses


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


def _output_dir(path: Path | None, flag: str) -> Path | None:
    if path is not None and path.exists() and not path.is_dir():
        raise OpdiffError(f"{flag} {path} is a file; give a directory to write into.")
    return path


@click.command()
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
        click.echo(api.reconcile_history(settings_of(ctx), "restore" if restore else "accept"))
    runs = api.runs(settings_of(ctx))
    Console().print(runs_table(runs))
    groups = api.run_groups(runs)
    if groups:
        Console().print(run_groups_table(groups))


def _runs_to_compare(f):
    """RUN_A RUN_B, or --by LIB [--versions A B]: which two runs a diff compares."""
    f = click.option("--versions", nargs=2, help="With --by: the two versions (default: the two latest).")(f)
    f = click.option("--by", help="Compare the latest runs on two versions of this library instead of run ids.")(f)
    f = click.argument("run_b", required=False)(f)
    return click.argument("run_a", required=False)(f)


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


def _warn(text: str) -> None:
    echo(f"opdiff: warning: {text}", err=True)


@click.command()
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
        print_table(Table(["view", "column", "type", "meaning"], api.schema(settings_of(ctx), _warn)), fmt)
        return
    if not sql:
        raise OpdiffError("query needs SQL (or --schema to see the views), e.g. "
                          "opdiff query \"SELECT * FROM runs\".")
    print_table(api.query(sql, settings_of(ctx), _warn), fmt)


@click.group(cls=OpdiffGroup)
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

    output_file(png, "--png")
    table = api.support(settings_of(ctx), by, _warn)
    print_table(table, fmt)
    if png:
        from ..analytics.plots import support_heatmap

        with writing(png, "--png"):
            echo(f"wrote {support_heatmap(table, png)}", err=True)


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
    rep = api.latency(settings_of(ctx), baseline, _warn)
    print_table(rep.ratios, fmt, f"latency ratio against {rep.baseline}")
    print_table(rep.trend, fmt, "median inference latency per run")
    if png_dir:
        from ..analytics.plots import latency_cdf, latency_trend_plot

        with writing(png_dir, "--png-dir"):
            png_dir.mkdir(parents=True, exist_ok=True)
            echo(f"wrote {latency_cdf(rep, png_dir / 'latency_cdf.png')}, "
                 f"{latency_trend_plot(rep.trend, png_dir / 'latency_trend.png')}", err=True)


@report.command("html")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True)
@_query_limits
@click.pass_context
@guarded
def report_html(ctx, output) -> None:
    """One self-contained HTML file: summary, support heatmap and matrix, latency, regressions."""
    from .. import api

    output_file(output, "-o/--output")
    with writing(output, "-o/--output"):
        echo(f"wrote {api.html_report(output, settings_of(ctx))}")


@report.command("site")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("site"), show_default=True,
              help="Folder to write index.html and tests/ into.")
@_query_limits
@click.pass_context
@guarded
@uses(history_filter())
def report_site(ctx, output, history) -> None:
    """A static site (a folder of HTML, no server): presets x environments, the changes found
    by `opdiff regressions`, and a page per test with its latency and status history."""
    from .. import api

    _output_dir(output, "-o/--output")
    with writing(output, "-o/--output"):
        index = api.site(output, history, settings_of(ctx), _warn)
    echo(f"wrote {index}")


@report.command("upgrade")
@_runs_to_compare
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("upgrade.html"), show_default=True)
@diff_thresholds
@_query_limits
@click.pass_context
@guarded
def report_upgrade(ctx, run_a, run_b, by, versions, output, drift_factor, latency_threshold) -> None:
    """diff-runs A B (or --by LIB) as one self-contained HTML page, with the latency ratio per op family."""
    from .. import api

    output_file(output, "-o/--output")
    with writing(output, "-o/--output"):
        path = api.diff_page(output, run_a, run_b, by=by, versions=tuple(versions) if versions else None,
                             drift_factor=drift_factor, latency_threshold=latency_threshold,
                             settings=settings_of(ctx), warn=_warn)
    echo(f"wrote {path}")


@click.command("diff-runs")
@_runs_to_compare
@diff_thresholds
@FORMAT_OPTION
@_query_limits
@click.pass_context
@guarded
def diff_runs(ctx, run_a, run_b, by, versions, drift_factor, latency_threshold, fmt) -> None:
    """Newly failing, newly passing, drifted metrics and latency changes from A to B."""
    from .. import api

    diff = api.diff_runs(run_a, run_b, by=by, versions=tuple(versions) if versions else None,
                         drift_factor=drift_factor, latency_threshold=latency_threshold,
                         settings=settings_of(ctx), warn=_warn)
    for title, table in diff.sections():
        print_table(table, fmt, f"{title} ({len(table)})")
    echo(diff.summary())
    sys.exit(1 if len(diff.newly_failing) else 0)


@click.command()
@click.option("--regressions-only", is_flag=True, help="Leave out improvements and other status changes.")
@FORMAT_OPTION
@_query_limits
@click.pass_context
@guarded
@uses(history_filter(changes=True), STEP_PARAMS)
def regressions(ctx, regressions_only, fmt, history, params) -> None:
    """Latency steps, status changes and error growth over the whole history, each at the
    environment change (torch, executorch, onnxruntime, ..., a backend plugin, OS, CPU) it
    happened at, grouped by that change; a latency step inside one environment is reported
    too, with no recorded environment change. Exit 1 when one is a regression (CI), 0 otherwise.

    \b
    opdiff regressions
    opdiff regressions -b executorch_cpu_fp32 --version torch --format json
    """
    from .. import api
    from ..analytics.findings import REGRESSION, findings_table, group_by_change, groups_table

    found = api.regressions(history, params, settings_of(ctx), _warn)
    if regressions_only:
        found = [f for f in found if f.direction == REGRESSION]
    if fmt in ("table", "markdown"):
        groups = group_by_change(found)
        print_table(groups_table(groups), fmt, f"changes ({len(groups)})")
    print_table(findings_table(found), fmt, f"findings ({len(found)})")
    n = sum(f.direction == REGRESSION for f in found)
    if fmt in ("table", "markdown"):
        rest, bare = len(found) - n, sum(not f.changes for f in found)
        echo(f"{n} regression{'s' if n != 1 else ''}, {rest} other change{'s' if rest != 1 else ''} "
             "at environment changes" + (f"; {bare} of them with no recorded environment change" if bare else ""))
    sys.exit(1 if n else 0)
