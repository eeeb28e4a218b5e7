"""The commands that check the goldens in two environments and compare them: upgrade and
compare-envs."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ..core.errors import OpdiffError
from ..core.limits import FlagError
from ..core.safetext import printable
from .app import (
    FORMAT_OPTION,
    NON_NEGATIVE,
    POSITIVE,
    diff_thresholds,
    echo,
    guarded,
    output_file,
    print_table,
    writing,
)
from .option_groups import SELECTION, TARGETS, Group, Targets, uses, workers


def _requirements(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    """--with values, each refused at parse time unless it is an exact NAME==VERSION pin."""
    from ..execution.workerenvs import parse_requirement

    for value in values:
        try:
            parse_requirement(value)
        except OpdiffError as exc:
            raise FlagError(str(exc).removeprefix(f"--with {value!r}: "), value, ctx, param) from None
    return values


@dataclass(frozen=True)
class Rounds:
    rounds: int
    min_ratio: float


ROUNDS = Group("rounds", (
    click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
                 help="Alternate the checks (here, there, here, there...) this many rounds and report a latency "
                      "change only when its interval over the rounds clears --min-ratio; 1: one check each, "
                      "diff-runs' threshold."),
    click.option("--min-ratio", type=NON_NEGATIVE, default=1.1, show_default=True,
                 help="With rounds: a latency change's 95 % interval must lie beyond this ratio."),
), lambda values: Rounds(**values))

SHOWN = Group("shown", (
    FORMAT_OPTION,
    click.option("-v", "--verbose", is_flag=True, help="Print every result, passing ones too."),
), lambda values: (values["fmt"], values["verbose"]))


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


def _ui(shown: tuple[str, bool]) -> _UpgradeUI:
    from .output import make_console

    fmt, verbose = shown
    return _UpgradeUI(make_console(sys.stderr if fmt in ("csv", "json") else sys.stdout), verbose)


@click.command()
@click.option("--with", "withs", multiple=True, metavar="PKG==VER", callback=_requirements,
              help="A package version for the other environment; repeatable.")
@click.option("--rerun-current", is_flag=True, help="Check this environment again even when a fresh run exists.")
@click.option("--html", type=click.Path(path_type=Path), help="Also write the comparison as one HTML page.")
@diff_thresholds
@click.pass_context
@guarded
@uses(SELECTION, TARGETS, ROUNDS, workers("jobs", "timeout_s", "repeats", "warmup", "batch"), SHOWN)
def upgrade(ctx, withs, rerun_current, html, drift_factor, latency_threshold, selection, targets: Targets,
            rounds: Rounds, settings, shown) -> None:
    """Check the goldens in an environment with --with packages replaced, and here; diff the two.

    \b
    opdiff upgrade --with onnxruntime==1.30.0 -b onnx_cpu_fp32
    The environment (this one's pins, the named packages replaced) is built with uv or
    venv + pip under the cache dir and reused by later upgrades with the same requirements.
    Exit 1 when something passes here and not there."""
    from .. import api
    from ..run.upgrade import UpgradeRequest

    fmt = shown[0]
    output_file(html, "--html")
    request = UpgradeRequest(list(withs), targets.backends, selection, targets.preset_options,
                             rerun_current=rerun_current, drift_factor=drift_factor,
                             latency_threshold=latency_threshold, rounds=rounds.rounds, min_ratio=rounds.min_ratio)
    rep = api.upgrade(request, settings=settings, argv=sys.argv[1:], ui=_ui(shown))
    how = "reused" if rep.env.reused else f"built with {rep.env.installer}"
    echo(f"\nenvironment {rep.env.root} ({how} in {rep.env.seconds:.1f} s)", err=fmt in ("csv", "json"))
    for title, table in rep.diff.sections():
        print_table(table, fmt, f"{title} ({len(table)})")
    echo(rep.diff.summary(), err=fmt in ("csv", "json"))
    if html:
        with writing(html, "--html"):
            echo(f"wrote {api.write_diff_page(rep.diff, html)}")
    sys.exit(1 if len(rep.diff.newly_failing) else 0)


@click.command("compare-envs")
@click.option("--python", "python_b", type=click.Path(path_type=Path), required=True,
              help="Environment B: the interpreter (or environment folder) its workers run under.")
@click.option("--python-a", type=click.Path(path_type=Path), help="Environment A (default: this one).")
@click.option("--drift-factor", type=POSITIVE, default=10.0, show_default=True, help="max_abs growth that counts.")
@click.pass_context
@guarded
@uses(SELECTION, TARGETS, ROUNDS, workers("jobs", "timeout_s", "repeats", "warmup", "batch"), SHOWN)
def compare_envs(ctx, python_b, python_a, drift_factor, selection, targets: Targets, rounds: Rounds, settings,
                 shown) -> None:
    """Check the goldens under two environments in interleaved rounds (A, B, A, B, ...) and
    compare: verdicts and drift from the first round, latency from all of them with a 95 %
    interval. The same environment twice (A/A) reports no latency change. Exit 1 when something
    passes in A and not in B.

    \b
    opdiff compare-envs --python /tmp/ort130/bin/python -b onnx_cpu_fp32 --rounds 5
    """
    from .. import api

    fmt = shown[0]
    rep = api.compare_envs(python_b, backends=targets.backends, python_a=python_a, selection=selection,
                           preset_options=targets.preset_options, rounds=rounds.rounds,
                           min_ratio=rounds.min_ratio, drift_factor=drift_factor, settings=settings,
                           argv=sys.argv[1:], ui=_ui(shown))
    for title, table in rep.diff.sections():
        print_table(table, fmt, f"{title} ({len(table)})")
    echo(rep.diff.summary() + f"; latency over {len(rep.pairs)} interleaved rounds "
         f"(95 % interval beyond {rounds.min_ratio}x)", err=fmt in ("csv", "json"))
    sys.exit(1 if len(rep.diff.newly_failing) else 0)

