"""check against the expectations file: what the summary says of it, the exit code it
makes, and `--update-expectations`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Sequence

from ..compare.results import Result
from ..core.errors import OpdiffError
from ..core.verdicts import Verdict
from ..expectations.entries import Expectations
from ..expectations.standing import Expecter, Standing, StandingReport
from .output import detail, printable


def update_command(argv: Sequence[str] | None = None) -> str:
    """This command line again, with --update-expectations."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--update-expectations"]
    return "opdiff " + " ".join(shlex.quote(a) for a in args) + " --update-expectations"


def standing_lines(standing: StandingReport, strict: bool, command: str, shown: int = 20) -> list[str]:
    """What the run was against the expectations: the new and different failures and the
    unexpected passes first, each with its one-line cause; then the counts."""
    lines: list[str] = []
    new, different = standing.of(Standing.NEW), standing.of(Standing.DIFFERENT)
    unexpected, expected = standing.of(Standing.UNEXPECTED_PASS), standing.of(Standing.EXPECTED)
    for title, rows in (("new failures (nothing expected them)", new),
                        ("failed otherwise than expected", different),
                        ("unexpected passes (a failure was expected)", unexpected)):
        if not rows:
            continue
        lines.append(f"{title}: {len(rows)}")
        for j in rows[:shown]:
            r = j.result
            was = f" (expected {j.expectation.verdict.value})" if j.expectation is not None and \
                j.standing is not Standing.NEW else ""
            lines.append(f"  {r.verdict.value}{was} {printable(r.test_id)} seed={r.seed} {printable(r.preset)}"
                         + (f": {printable(detail(r, 160))}" if r.message and r.verdict not in (Verdict.PASS,)
                            else ""))
        if len(rows) > shown:
            lines.append(f"  ... and {len(rows) - shown} more")
    path = printable(standing.path)
    for e in standing.expired:
        lines.append(f"expired: {printable(e.preset)}: {printable(e.test)} expected {e.verdict.value} until "
                     f"'{printable(e.until)}', which no longer holds here (line {e.line} of {path}); it excuses "
                     "nothing now")
    verdict = "fails" if standing.fails(strict) else "passes"
    lines.append(f"expectations ({path}): {len(expected)} expected, {len(new)} new, {len(different)} "
                 f"different, {len(unexpected)} unexpected pass{'es' if len(unexpected) != 1 else ''}"
                 + (" (warnings: strict_expectations is off)" if unexpected and not strict else "")
                 + f"; the run {verdict}")
    if new or different or unexpected:
        lines.append(f"to accept these results as expected: {command}")
    return lines


def judge(expectations: Expectations, results: Sequence[Result], fail_on: set[Verdict]) -> StandingReport:
    return Expecter(expectations, fail_on).report(results)


def write_update(results: Sequence[Result], fail_on: set[Verdict], path: Path,
                 loaded: Expectations | None = None) -> list[str]:
    """Rewrite `path` to agree with the run (the file as it is when written: another update
    may have changed it since the run read it as `loaded`); the lines that say what changed."""
    from ..backends.registry import preset_names
    from ..expectations.rewrite import rewrite

    try:
        changes = rewrite(path, results, fail_on, preset_names(), loaded)
    except OSError as exc:
        raise OpdiffError(f"--update-expectations: cannot write {path} ({exc.strerror or exc}); the run itself is "
                          "in the history.") from None
    if not changes:
        return [f"expectations: {path} already agrees with this run; unchanged"]
    return [f"expectations: {path} updated ({len(changes.added)} added, {len(changes.changed)} changed, "
            f"{len(changes.removed)} removed):"] + [f"  {line}" for line in changes.lines()]
