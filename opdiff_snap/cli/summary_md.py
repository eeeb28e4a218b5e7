"""A check's summary in Markdown, for a CI page (`--summary-md FILE`, or GitHub's
`GITHUB_STEP_SUMMARY`): per preset the counts by verdict and the pass rate; then what
needs a look first (new failures, failures of another kind, unexpected passes), each with
its one-line cause and the command to run next; the expected failures folded away."""

from __future__ import annotations

import os
import shlex
from collections import Counter
from pathlib import Path
from typing import Sequence

from ..compare.results import Result, RunReport
from ..core.markdown_text import md_code, md_text
from ..core.verdicts import PASSING, QUIET, Verdict
from ..expectations.standing import Standing, StandingReport
from .output import detail


def _cell(text: object) -> str:
    """Text shown as itself in one table cell or line (core/markdown_text.py), at most 200 characters."""
    return md_text(text, 200)


def _code(text: object, cell: bool = True) -> str:
    """Text as a code span it cannot close, in a table cell unless `cell` is false."""
    return md_code(text, 200, cell=cell)


def cause(r: Result) -> str:
    """The result's one-line cause (for an op test that cannot lower, the test's own line
    in its suite, not opdiff's)."""
    return detail(r, 200)


def next_command(r: Result) -> str:
    """What to run next: localize for a module test that ran and disagrees, else repro."""
    from .output import repro_command

    if r.test_type == "module" and r.verdict is Verdict.MISMATCH and _localizes(r.preset):
        return f"opdiff localize {shlex.quote(r.test_id)} -b {shlex.quote(r.preset)} --seed {r.seed}"
    return repro_command(r) or ""


def _localizes(preset_name: str) -> bool:
    """Whether localize takes the preset (an int8 one only where its quantized model is a
    torch graph)."""
    from ..backends.registry import backend_for, get_preset
    from ..core.errors import OpdiffError

    try:
        preset = get_preset(preset_name)
    except OpdiffError:
        return False
    return preset.scheme is None or backend_for(preset).steps_through_quantized(preset)


def _rows(judged: Sequence[tuple[Result, str]]) -> list[str]:
    lines = ["| test | seed | preset | verdict | cause | next |", "| --- | --- | --- | --- | --- | --- |"]
    for r, verdict in judged:
        cmd = next_command(r)
        lines.append(f"| {_code(r.test_id)} | {r.seed} | {_cell(r.preset)} | {_cell(verdict)} | "
                     f"{_cell(cause(r)) if r.verdict not in PASSING else ''} | {_code(cmd)} |")
    return lines


def markdown(report: RunReport, fail_on: set[Verdict], standing: StandingReport | None = None,
             shown: int = 50, strict: bool = True) -> str:
    results = report.results
    presets = sorted({r.preset for r in results})
    verdicts = sorted({r.verdict for r in results}, key=lambda v: v.value)
    lines = [f"## opdiff {_cell(report.command)} {_cell(report.run_id)}", "",
             f"{len(results)} results in {report.wall_s:.1f} s; history {_code(report.path, cell=False)}.", "",
             "| preset | " + " | ".join(v.value for v in verdicts) + " | pass rate |",
             "| --- |" + " --- |" * (len(verdicts) + 1)]
    for p in presets:
        counts = Counter(r.verdict for r in results if r.preset == p)
        ran = sum(n for v, n in counts.items() if v not in QUIET)
        passed = sum(n for v, n in counts.items() if v in PASSING)
        rate = f"{100 * passed / ran:.1f} %" if ran else "-"
        lines.append(f"| {_cell(p)} | " + " | ".join(str(counts.get(v, "")) for v in verdicts) + f" | {rate} |")
    lines.append("")
    if standing is None:
        failing = [(r, r.verdict.value) for r in results if r.verdict in fail_on]
        if failing:
            lines += [f"### Failures ({len(failing)})", ""] + _rows(failing[:shown])
            if len(failing) > shown:
                lines.append(f"\nand {len(failing) - shown} more (`opdiff query`).")
        return "\n".join(lines) + "\n"
    groups = ((Standing.NEW, "New failures"), (Standing.DIFFERENT, "Failed otherwise than expected"),
              (Standing.UNEXPECTED_PASS, "Unexpected passes"))
    for kind, title in groups:
        rows = standing.of(kind)
        if not rows:
            continue
        shown_rows = [(j.result, j.result.verdict.value if j.expectation is None or kind is Standing.NEW
                       else f"{j.result.verdict.value} (expected {j.expectation.verdict.value})") for j in rows]
        lines += [f"### {title} ({len(rows)})", ""] + _rows(shown_rows[:shown]) + [""]
        if len(rows) > shown:
            lines += [f"and {len(rows) - shown} more (`opdiff query`).", ""]
    for e in standing.expired:
        lines.append(f"- expired: {_cell(e.preset)} {_code(e.test, cell=False)} expected {e.verdict.value} "
                     f"until {_code(e.until, cell=False)} (line {e.line} of {_code(standing.path, cell=False)})")
    expected = standing.of(Standing.EXPECTED)
    verdict = "fails" if standing.fails(strict) else "passes"
    lines += ["", f"**The run {verdict}** against {_code(standing.path, cell=False)}: "
              f"{len(expected)} expected failures, "
              f"{len(standing.of(Standing.NEW))} new, {len(standing.of(Standing.DIFFERENT))} different, "
              f"{len(standing.of(Standing.UNEXPECTED_PASS))} unexpected passes.", ""]
    if expected:
        lines += ["<details><summary>Expected failures</summary>", "",
                  "| test | preset | verdict | reason |", "| --- | --- | --- | --- |"]
        for j in expected[:500]:   # a CI page holds about 1 MiB
            reason = j.expectation.reason if j.expectation is not None else ""
            lines.append(f"| {_code(j.result.test_id)} | {_cell(j.result.preset)} | "
                         f"{j.result.verdict.value} | {_cell(reason)} |")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def summary_path(given: Path | None) -> Path | None:
    """--summary-md, else GitHub's step summary file when the job has one."""
    if given is not None:
        return given
    env = os.environ.get("GITHUB_STEP_SUMMARY")
    return Path(env) if env else None
