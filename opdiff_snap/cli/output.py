"""How a run's results are shown: live progress, the closing summary, JSON and JUnit XML.

Test ids, messages and versions come from goldens and the history, which are data anyone
with write access may have edited: each reaches the terminal as a rich `Text` (never parsed
as markup) or through `_markup`, and the JUnit file through `printable`, so no control
character or markup in them acts."""

from __future__ import annotations

import json
import math
import os
import shlex
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ..backends.base import QUANTIZED
from ..compare.metrics import Metrics
from ..compare.results import Result, RunReport
from ..core.errors import OpdiffError, headline, suggest
from ..core.safetext import printable
from ..core.verdicts import NOT_FAILING, PASSING, PRECEDENCE, QUIET, REPRODUCIBLE, Verdict
from ..suite.model import RecordedGrads

GOOD = PASSING


def _text(value: Any) -> Text:
    """A table cell or line from data: shown as it is, escaped, never read as markup."""
    return Text(printable(value))


def _markup(value: Any) -> str:
    """Data to put inside a rich markup string."""
    return escape(printable(value))


def _style(v: Verdict) -> str:
    if v in GOOD:
        return "green"
    if v in QUIET:
        return "yellow"
    return "red"


def _counts_text(counts: Counter) -> str:
    return "  ".join(f"[{_style(Verdict(k))}]{k}[/] {n}" for k, n in sorted(counts.items()))


class ProgressDisplay:
    """A bar with counts by verdict and an ETA on a terminal; one plain line per
    result otherwise (CI logs)."""

    def __init__(self, console: Console, total: int | None, label: str, verbose: bool = False):
        self.console = console
        self.total = total
        self.label = label
        self.counts: Counter = Counter()
        self.interactive = console.is_terminal
        self.verbose = verbose
        self._progress: Progress | None = None
        self._task: Any = None

    def __enter__(self) -> "ProgressDisplay":
        if self.interactive:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                      TextColumn("{task.fields[counts]}"), console=self.console,
                                      transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.label, total=self.total, counts="")
        return self

    def warn(self, text: str) -> None:
        Console(stderr=True, soft_wrap=True).print(f"opdiff: warning: {printable(text, lines=True)}",
                                                   highlight=False, markup=False)

    def notice(self, text: str) -> None:
        """A line for the user before the results (what --trust-goldens imports, say)."""
        console = self._progress.console if self._progress is not None else self.console
        console.print(f"note: {printable(text, lines=True)}", highlight=False, markup=False, soft_wrap=True)

    def set_total(self, total: int) -> None:
        """Called by record/check once they know how many results to expect (for the ETA)."""
        self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def __call__(self, result: Result) -> None:
        self.counts[result.verdict.value] += 1
        if self._progress is not None:
            self._progress.update(self._task, advance=1, counts=_counts_text(self.counts))
            if result.verdict not in GOOD | QUIET or self.verbose:
                self._progress.console.print(_line(result), highlight=False, markup=False)
        else:
            done = sum(self.counts.values())
            of = f"/{self.total}" if self.total else ""
            self.console.print(f"[{done}{of}] {_line(result)}", highlight=False, markup=False,
                               soft_wrap=True)


def label(r: Result) -> str:
    """The verdict as the tables show it: `(cached)` where a failure was answered from the
    artifact cache, `(precision-limited)` where torch itself shares a MISMATCH at the target's
    precision."""
    if r.cache_hit and r.verdict in (Verdict.EXPORT_FAIL, Verdict.LOAD_FAIL):
        return f"{r.verdict.value} (cached)"
    return f"{r.verdict.value} (precision-limited)" if r.precision_limited else r.verdict.value


def vacuous_lines(results: Sequence[Result], shown: int = 3) -> list[str]:
    """The goldens that prove nothing (any plausible answer matches them), a few by name."""
    reasons: dict[str, str] = {}
    for r in results:
        if r.vacuous:
            reasons.setdefault(r.test_id, r.vacuous)
    if not reasons:
        return []
    named = [f"{printable(test)}: {reason}" for test, reason in list(reasons.items())[:shown]]
    more = f" (and {len(reasons) - shown} more: `opdiff query \"SELECT DISTINCT test_id, vacuous FROM results " \
           f"WHERE vacuous IS NOT NULL\"`)" if len(reasons) > shown else ""
    head = f"{len(reasons)} goldens prove nothing, so their PASS is no evidence" if len(reasons) > 1 else \
        "1 golden proves nothing, so its PASS is no evidence"
    return [f"{head}{more}:"] + [f"  {line}" for line in named]


def _line(r: Result) -> str:
    """One result as a plain line (data escaped; print it with markup off)."""
    text = f"{label(r):<18} {printable(r.test_id)} seed={r.seed} {printable(r.preset)}"
    if r.infer_ms is not None:
        text += f" infer={r.infer_ms:.3f}ms"
    if r.metrics and r.verdict not in GOOD and _max_abs(r) is not None:
        text += f" max_abs={_max_abs(r)}"
    if r.message and r.verdict not in GOOD:
        text += f" -- {printable(detail(r, 200))}"
    return text


def detail(r: Result, width: int = 160) -> str:
    """What a not-passing result says in one line: the ops its preset cannot lower, where
    they were surveyed, else the informative line of its message."""
    if r.unsupported_ops:
        n = len(r.unsupported_ops)
        head = f"cannot lower {n} op{'s' if n > 1 else ''}: "
        where = _test_place(r)
        if where is not None:   # an op test: no code of the user's called the op
            names = ", ".join(u.op.removeprefix("aten::") for u in r.unsupported_ops)
            return f"{head}{names} (the test at {where})"[:width]
        ops = ", ".join(f"{u.op.removeprefix('aten::')}" + (f" ({u.sources[0].split(' in ')[0]})" if u.sources else "")
                        for u in r.unsupported_ops)
        return f"{head}{ops}"[:width]
    return headline(r.message, width)


_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def _test_place(r: Result) -> str | None:
    """'suites/x.yaml:LINE' where every source of the ops a result cannot lower is opdiff's
    own code (the test has none of the user's), else None."""
    paths = [p for u in r.unsupported_ops or [] for p in u.source_paths]
    if not r.suite or not paths or not all(p.startswith(_PACKAGE) for p in paths):
        return None
    from ..suite.load import line_of_test

    line = line_of_test(r.suite, r.test_id)
    return f"{r.suite}:{line}" if line else str(r.suite)


def _numbers(r: Result) -> Metrics | None:
    """The numbers of a result's comparison; None when it has none."""
    return r.metrics if r.metrics is not None and r.metrics.compared else None


def _max_abs(r: Result) -> float | None:
    m = _numbers(r)
    return None if m is None else m.max_abs


def _severity(r: Result) -> float:
    m = _numbers(r)
    return m.min_atol if m is not None and math.isfinite(m.min_atol) else float("inf")


def print_summary(console: Console, report: RunReport, limit: int = 20, standing=None) -> None:
    """Results grouped by verdict, failures first and worst metrics first. `standing` (an
    expectations.standing.StandingReport): the failures expected as they came are left out
    of the table (counted at the end)."""
    counts = Counter(r.verdict for r in report.results)
    failing = [r for r in report.results if r.verdict not in GOOD | QUIET]
    if standing is not None:
        from ..expectations.standing import Standing

        expected = {id(j.result) for j in standing.judged if j.standing is Standing.EXPECTED}
        failing = [r for r in failing if id(r) not in expected]
    failing.sort(key=lambda r: (PRECEDENCE.index(r.verdict), -_severity(r)))
    if failing:
        table = Table(title="Not passing (worst first)", show_lines=False)
        with_metrics = any(r.metrics for r in failing)
        cols = ("verdict", "test", "seed", "preset") + (("max_abs", "min_atol") if with_metrics else ()) + ("detail",)
        for col in cols:
            table.add_column(col, overflow="fold")
        for r in failing[:limit]:
            m = _numbers(r)
            metrics = (_fmt(_max_abs(r)), _fmt(None if m is None else m.min_atol)) if with_metrics else ()
            table.add_row(label(r), _text(r.test_id), str(r.seed), _text(r.preset), *metrics,
                          _text(detail(r)))
        console.print(table)
        if len(failing) > limit:
            console.print(f"... and {len(failing) - limit} more (see `opdiff query` or --format json)")
        first = next((c for c in map(repro_command, failing) if c), None)
        if first and report.command == "check":
            console.print(f"to reproduce a failure outside opdiff, e.g.: {_markup(first)} -o bug.py "
                          "(--format json lists the command for each)", highlight=False)
    quiet = [r for r in report.results if r.verdict in QUIET]
    reasons = Counter((r.verdict.value, r.preset, (r.message or "").splitlines()[0][:100] if r.message else "")
                      for r in quiet)
    for (verdict, preset, reason), n in sorted(reasons.items()):
        console.print(f"[yellow]{verdict}[/] {_markup(preset)} x{n}: {_markup(reason)}", highlight=False)
    for line in delegation_lines(report.results) + vacuous_lines(report.results):
        console.print(line, highlight=False, markup=False)
    parts = ", ".join(f"{n} {v.value}" for v, n in sorted(counts.items(), key=lambda kv: kv[0].value))
    console.print(f"[bold]{_markup(report.command)}[/] {_markup(report.run_id)}: {len(report.results)} results in "
                  f"{report.wall_s:.1f} s: {parts or 'nothing to do'}", highlight=False)
    console.print(f"history: {_markup(report.path)}", highlight=False)


def delegation_lines(results: list[Result], shown: int = 6) -> list[str]:
    """Per delegating preset of a run: the delegated share of the op nodes, and the ops that
    stayed on the runtime's own kernels, most nodes first, with a source line each."""
    per: dict[str, list[Result]] = {}
    for r in results:
        if r.delegation is not None:
            per.setdefault(r.preset, []).append(r)
    lines = []
    for preset, rs in sorted(per.items()):
        took = sum(r.delegation.delegated for r in rs if r.delegation)
        left = sum(r.delegation.fallback for r in rs if r.delegation)
        delegates = ", ".join(sorted({r.delegation.delegate for r in rs if r.delegation}))
        share = 100.0 * took / (took + left) if took + left else 100.0
        text = (f"{printable(preset)}: {delegates} took {share:.0f}% of {took + left} op nodes "
                f"({len(rs)} result{'s' if len(rs) != 1 else ''})")
        fell: dict[str, list] = {}
        for r in rs:
            for o in r.delegation.fallback_ops() if r.delegation else []:
                entry = fell.setdefault(o.op, [0, set(), ""])
                entry[0] += o.fallback
                entry[1].add(r.test_id)
                entry[2] = entry[2] or (o.sources[0] if o.sources else "")
        if fell:
            top = sorted(fell.items(), key=lambda kv: (-kv[1][0], kv[0]))
            text += "; fell back: " + ", ".join(
                f"{op.removeprefix('aten::')} x{n} in {len(tests)} test{'s' if len(tests) != 1 else ''}"
                + (f" ({src.split(' in ')[0]})" if src else "") for op, (n, tests, src) in top[:shown])
            if len(top) > shown:
                text += f", and {len(top) - shown} more ops"
        lines.append(printable(text))
    return lines


def repro_command(r: Result) -> str | None:
    """The command that writes a standalone script reproducing a failing check result
    (each argument quoted for a POSIX shell)."""
    if r.verdict not in REPRODUCIBLE or r.preset.rsplit("_", 1)[-1] in QUANTIZED:   # int8: no script reproduces it
        return None
    return f"opdiff repro {shlex.quote(r.test_id)} -b {shlex.quote(r.preset)} --seed {r.seed}"


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def report_json(report: RunReport) -> str:
    return json.dumps({
        "run_id": report.run_id, "command": report.command, "history": str(report.path),
        "wall_s": round(report.wall_s, 3), "counts": report.counts(),
        "results": [{"id": r.test_id, "seed": r.seed, "preset": r.preset, "status": r.verdict.value,
                     "message": r.message, "error_class": r.error_class, "infer_ms": r.infer_ms,
                     "export_ms": r.export_ms, "load_ms": r.load_ms, "cache_hit": r.cache_hit,
                     "metrics": r.metrics.to_json() if r.metrics is not None else None,
                     "tolerance": vars(r.tolerance) if r.tolerance else None,
                     "repro": repro_command(r) if report.command == "check" else None}
                    for r in report.results]}, indent=1, ensure_ascii=True)   # every control character as \uXXXX


def write_junit(report: RunReport, path: Path, fail_on: set[Verdict], strict: bool = True) -> None:
    """One <testcase> per (test, seed, preset); a <testsuite> per preset. Every text from
    the results goes through `printable`: XML 1.0 cannot hold most control characters, not
    even as character references."""
    root = ET.Element("testsuites", name=printable(f"opdiff {report.command} {report.run_id}"))
    by_preset: dict[str, list[Result]] = {}
    for r in report.results:
        by_preset.setdefault(r.preset, []).append(r)
    for preset, results in by_preset.items():
        fails = sum(_junit_fails(r, fail_on, strict) for r in results)
        skipped = sum(not _junit_fails(r, fail_on, strict) and r.verdict not in GOOD for r in results)
        suite = ET.SubElement(root, "testsuite", name=printable(preset), tests=str(len(results)),
                              failures=str(fails), errors="0", skipped=str(skipped))
        for r in results:
            case = ET.SubElement(suite, "testcase", classname=printable(f"opdiff.{preset}"),
                                 name=printable(f"{r.test_id}[seed={r.seed}]"),
                                 time=f"{(r.infer_ms or 0) / 1000:.6f}")
            detail = f"{r.verdict.value}: {r.message}" if r.message else r.verdict.value
            if r.metrics:
                detail += "\n" + json.dumps(r.metrics.to_json())
            detail = printable(detail, lines=True)
            if strict and r.expected is not None and r.verdict in GOOD:   # a failure was expected
                ET.SubElement(case, "failure", message=f"unexpected pass: {r.expected.value} was expected",
                              type="UNEXPECTED_PASS").text = detail
            elif _junit_fails(r, fail_on, strict):
                ET.SubElement(case, "failure", message=detail.splitlines()[0][:500],
                              type=r.verdict.value).text = detail
            elif r.expected is r.verdict and r.verdict not in GOOD:
                ET.SubElement(case, "skipped", message=f"expected failure: {detail.splitlines()[0][:480]}")
            elif r.verdict not in GOOD:
                ET.SubElement(case, "skipped", message=detail.splitlines()[0][:500])
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _junit_fails(r: Result, fail_on: set[Verdict], strict: bool = True) -> bool:
    """A failure in JUnit: a --fail-on verdict not expected as it came, or (strict) an
    unexpected pass."""
    return ((r.verdict in fail_on and r.expected is not r.verdict)
            or (strict and r.expected is not None and r.verdict in GOOD))


def parse_fail_on(text: str | None) -> set[Verdict]:
    if not text:
        return set(Verdict) - NOT_FAILING
    out = set()
    for name in text.replace(";", ",").split(","):
        name = name.strip().upper()
        if not name:
            continue
        try:
            out.add(Verdict(name))
        except ValueError:
            raise OpdiffError(f"--fail-on: '{name}' is not a verdict{suggest(name, [v.value for v in Verdict])}; "
                              f"valid: {', '.join(v.value for v in Verdict)}.") from None
    return out


def make_console(file) -> Console:
    """Rich on a terminal; wide, uncoloured plain text in logs (CI) so tables stay readable."""
    console = Console(file=file)
    if not console.is_terminal:
        console = Console(file=file, width=200, no_color=True)
    return console


def exit_code(results: Sequence[Result], fail_on: set[Verdict]) -> int:
    return 1 if any(r.verdict in fail_on for r in results) else 0


def _summary(value) -> str:
    import torch

    if not isinstance(value, torch.Tensor):
        return repr(value)[:80]
    if value.numel() == 0:
        return "empty"
    if value.is_complex():
        value = torch.view_as_real(value)
    if value.dtype == torch.bool:
        return f"true {int(value.sum())}/{value.numel()}"
    v = value.double()
    finite = v[torch.isfinite(v)]
    text = f"min {v.min().item():.4g}  max {v.max().item():.4g}"
    if finite.numel():
        text += f"  mean {finite.mean().item():.4g}  std {finite.std().item() if finite.numel() > 1 else 0:.4g}"
    nonfinite = v.numel() - finite.numel()
    return text + (f"  non-finite {nonfinite}" if nonfinite else "")


def _value_rows(prefix: str, value) -> list[tuple[str, object]]:
    if isinstance(value, (list, tuple)):
        return [r for i, v in enumerate(value) for r in _value_rows(f"{prefix}[{i}]", v)]
    if isinstance(value, dict):
        return [r for k, v in value.items() for r in _value_rows(f"{prefix}[{k!r}]", v)]
    return [(prefix, value)]


def _values_table(title: str, rows: list[tuple[str, object]]) -> Table:
    import torch

    table = _table(["value", "shape", "dtype", "summary"], title=_markup(title))
    for name, value in rows:
        if isinstance(value, torch.Tensor):
            table.add_row(_text(name), str(tuple(value.shape)), str(value.dtype).removeprefix("torch."),
                          _summary(value))
        else:
            table.add_row(_text(name), "", type(value).__name__, _text(_summary(value)))
    return table


def _grad_rows(grads: RecordedGrads) -> list[tuple[str, object]]:
    """Rows of a recorded gradient value: the cotangent, then d(loss)/d(each input and parameter)."""
    rows: list[tuple[str, object]] = [(f"cotangent[{i}]", c) for i, c in enumerate(grads.cotangent)]
    for kind, values in grads.grads.items():
        rows += [(f"grad {kind} {name}", v) for name, v in (values or {}).items()]
    return rows


def describe_golden(console: Console, golden) -> None:
    """`opdiff goldens show`: every stored value (inputs, parameters, outputs; gradients
    when recorded) with shape, dtype and a summary, then the metadata."""
    rows = _value_rows("args", golden.invocation.args) + _value_rows("kwargs", golden.invocation.kwargs)
    for side, state in golden.invocation.states.items():
        rows += [(f"state[{side}].{k}", v) for k, v in state.items()]
    rows += _value_rows("outputs", golden.outputs)
    console.print(_values_table(f"{golden.test_id} seed={golden.seed}", rows))
    if golden.grads is not None:
        console.print(_values_table(f"gradients of {golden.test_id} seed={golden.seed}",
                                    _grad_rows(golden.grads)))
    meta = {"spec_hash": golden.spec_hash, "suite": golden.suite, "test_type": golden.test_type,
            "baseline": golden.baseline, "created": golden.created, "env": golden.env,
            "definition": golden.definition}
    console.print_json(json.dumps(meta, default=str), ensure_ascii=True)


# ---------------------------------------------------------------- tables of the listing commands


def _table(columns: Sequence[str], title: str | None = None) -> Table:
    """A table whose columns wrap (fold) rather than truncate."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    return table

def presets_table(rows) -> Table:
    """`opdiff list-presets`: (Preset, Availability) rows."""
    table = _table(["preset", "export", "run", "why not"])
    for preset, a in rows:
        table.add_row(_text(preset.name), "yes" if a.can_export else "no", "yes" if a.can_run else "no",
                      "" if a.can_export and a.can_run else _text(a.reason))
    return table


def runs_table(runs) -> Table:
    """`opdiff runs`: history.RunSummary rows."""
    table = _table(["run", "command", "started", "complete", "counts", "group"])
    for r in runs:
        state = "yes" if r.complete else ("NO: resumable (check --resume)" if r.resumable else f"NO: {r.note}")
        if r.recovered:
            state += (f"; completed from the spool of {r.recovered.get('host')}: its last "
                      f"{_int(r.recovered.get('items')) - _int(r.recovered.get('items_stored_before'))} results "
                      "reached the store after it was interrupted")
        group = f"{r.run_group} ({r.shard})" if r.shard else (r.run_group or "")
        table.add_row(_text(r.run_id), _text(r.command), _text(r.started), _text(state),
                      _text(json.dumps(r.counts)) if r.counts else "", _text(group))
    return table


def _int(value) -> int:
    return value if isinstance(value, int) else 0


def run_groups_table(groups) -> Table:
    """`opdiff runs`: history.GroupSummary rows, one logical run each."""
    table = _table(["group", "runs", "complete", "counts", "longest shard / mean"],
                   title="run groups (one logical run each)")
    for g in groups:
        state = "yes" if g.complete else ("NO: shards missing " + ", ".join(g.missing_shards)
                                          if g.missing_shards else "NO: a shard is unfinished")
        measured, expected = g.shard_balance()
        balance = ", ".join(part for part in (f"{measured:.2f}x measured" if measured else "",
                                               f"{expected:.2f}x expected" if expected else "") if part)
        table.add_row(_text(g.run_group), str(len(g.runs)), _text(state), _text(json.dumps(g.counts)),
                      _text(balance))
    return table


def goldens_table(rows) -> Table:
    """`opdiff goldens ls`: api.GoldenRow rows."""
    table = _table(["test", "seeds", "baseline", "torch", "created", "state"])
    for row in rows:
        first = row.infos[0]
        table.add_row(_text(row.test_id), ",".join(str(i.seed) for i in row.infos), _text(first.baseline),
                      _text((first.env or {}).get("torch")), _text(first.created[:19]), _text(row.state))
    return table
