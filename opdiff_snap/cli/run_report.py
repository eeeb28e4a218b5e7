"""What a record or check shows and writes when it ends: the summary (or JSON), the
expectations' standing and update, JUnit, the Markdown summary, and the exit code."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import click

from ..compare.results import RunReport
from ..core.errors import OpdiffError
from .app import echo, output_file, settings_of
from .option_groups import Expecting, Reporting


def run_and_report(runner: Callable, reporting: Reporting, label: str, expecting: Expecting | None = None) -> None:
    """Run (`runner(listener)`), print the summary, write JUnit (and for a check the
    Markdown summary), exit. With `expecting`, the exit code is the expectations file's."""
    from .output import ProgressDisplay, exit_code, make_console, parse_fail_on, print_summary, report_json

    fail_on = parse_fail_on(reporting.fail_on)
    strict = settings_of(click.get_current_context()).strict_expectations
    output_file(reporting.junit, "--junit")
    if label.startswith("check"):
        from .summary_md import summary_path

        output_file(summary_path(reporting.summary_md),
                    "--summary-md" if reporting.summary_md is not None else "GITHUB_STEP_SUMMARY")
    console = make_console(sys.stderr if reporting.fmt == "json" else sys.stdout)
    with ProgressDisplay(console, None, label, reporting.verbose) as progress:
        report = runner(progress)
    standing = None
    if expecting is not None:
        from .expecting import judge

        standing = judge(expecting.expectations, report.results, fail_on)
    if reporting.fmt == "json":
        echo(report_json(report))
    else:
        print_summary(console, report, standing=standing)
    out = console if reporting.fmt != "json" else make_console(sys.stderr)
    if expecting is not None and expecting.update:   # --update-expectations: the file first, then the rest
        from .expecting import write_update

        for line in write_update(report.results, fail_on, expecting.path, expecting.expectations):
            out.print(line, highlight=False, markup=False)
    _write_junit(report, reporting, fail_on, strict)
    if report.command == "check":
        _write_summary(report, fail_on, standing, reporting.summary_md, strict)
    if expecting is None:
        sys.exit(exit_code(report.results, fail_on))
    if expecting.update:
        sys.exit(0)
    from .expecting import standing_lines, update_command

    assert standing is not None
    for line in standing_lines(standing, strict, update_command()):
        out.print(line, highlight=False, markup=False)
    sys.exit(1 if standing.fails(strict) else 0)


def _write_junit(report: RunReport, reporting: Reporting, fail_on, strict: bool) -> None:
    from .output import write_junit

    if not reporting.junit:
        return
    try:
        write_junit(report, Path(reporting.junit), fail_on, strict)
    except OSError as exc:
        raise OpdiffError(f"--junit {reporting.junit}: cannot write it ({exc.strerror}); the run itself is in "
                          f"{report.path}.") from None


def _write_summary(report: RunReport, fail_on, standing, given: Path | None, strict: bool) -> None:
    """The Markdown summary into --summary-md (written anew) or GitHub's step summary
    (appended to, as each step of a job does)."""
    from .summary_md import markdown, summary_path

    target = summary_path(given)
    if target is None:
        return
    try:
        with open(target, "w" if given is not None else "a", encoding="utf-8") as f:
            f.write(markdown(report, fail_on, standing, strict=strict))
    except OSError as exc:
        raise OpdiffError(f"cannot write the Markdown summary to {target} ({exc.strerror or exc}); the run itself "
                          f"is in {report.path}.") from None
