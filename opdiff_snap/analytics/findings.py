"""What the step detector found, and the same findings grouped by the environment change
they happened at ("torch 2.13.0 -> 2.14.1: 3 tests stopped exporting on coreml_any_fp16")."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from dataclasses import dataclass, field

from ..core.verdicts import COMPARISON, Verdict
from .table import Table

# One environment difference between the runs on either side of a finding.
Change = tuple[str, str | None, str | None]      # (field, before, after)

KINDS = ("status", "latency", "metric", "quantization", "lowering")
# int8 results: a quantization error (quant_sqnr) that moved by more than this many dB
# changed, and a lowering error (lowering_steps) that moved by more than this many steps
QUANT_SQNR_DB = 1.0
LOWERING_STEPS = 1.0
REGRESSION, IMPROVEMENT, CHANGED = "regression", "improvement", "change"

_STARTED = {Verdict.EXPORT_FAIL: "stopped exporting", Verdict.LOAD_FAIL: "stopped loading",
            Verdict.INFER_FAIL: "started failing at inference", Verdict.CRASH: "started crashing",
            Verdict.TIMEOUT: "started timing out", Verdict.NOT_DELEGATED: "stopped delegating",
            Verdict.QUANTIZE_FAIL: "stopped quantizing",
            **{v: "started mismatching" for v in COMPARISON},
            Verdict.SQNR_LOW: "lost quantization precision"}


@dataclass(frozen=True)
class Finding:
    """One change in one (host, test, seed, preset) history, at the first run after it."""

    kind: str                      # status, latency, metric, or on int8: quantization, lowering
    direction: str                 # regression, improvement or change
    host: str | None
    test_id: str
    seed: int | None
    preset: str
    run_id: str                    # the first run after the change
    previous_run: str              # the last run before it
    started: dt.datetime | None    # when run_id started
    before: str                    # a status, a latency level ("0.0261 ms") or a max_abs
    after: str
    ratio: float | None = None     # latency: after / before level; metric: after / before
    ci_low: float | None = None    # latency: the confidence interval of that ratio
    ci_high: float | None = None
    changes: tuple[Change, ...] = ()

    @property
    def change(self) -> str:
        return change_text(self.changes)


UNATTRIBUTED = "no recorded environment change"
PLUGINS = "plugins"     # the environment field naming the backend plugins' distributions


def change_text(changes: tuple[Change, ...]) -> str:
    if not changes:
        return UNATTRIBUTED
    return ", ".join(f"{name} {before or '(none)'} -> {after or '(none)'}" for name, before, after in changes)


def environment_changes(fields: tuple[str, ...], before: tuple, after: tuple) -> tuple[Change, ...]:
    """(field, before, after) for each environment field whose value differs; the backend
    plugins as one change per distribution ("slowpoke-plugin", "1.0", "1.1")."""
    out: list[Change] = []
    for name, a, b in zip(fields, before, after):
        if a == b:
            continue
        if name == PLUGINS:
            out += _plugin_changes(_text(a), _text(b))
        else:
            out.append((name, _text(a), _text(b)))
    return tuple(out)


def _plugin_changes(before: str | None, after: str | None) -> list[Change]:
    """'a 1.0, b 2.0' -> 'a 1.1': [("a", "1.0", "1.1"), ("b", "2.0", None)]."""
    def versions(text: str | None) -> dict[str, str]:
        pairs = (item.strip().rpartition(" ") for item in (text or "").split(","))
        return {name or version: version if name else "" for name, _, version in pairs if name or version}

    a, b = versions(before), versions(after)
    return [(name, a.get(name) or None, b.get(name) or None) for name in sorted(set(a) | set(b))
            if a.get(name) != b.get(name)]


def _text(v) -> str | None:
    return None if v is None else str(v)


def matches_version(f: Finding, spec: str) -> bool:
    """`spec` is a field (`torch`: the finding's change involves torch) or field==version
    (`torch==2.14.1`: torch went to or from that version)."""
    name, _, version = spec.partition("==")
    for field_, before, after in f.changes:
        if field_ == name.strip() and (not version or version.strip() in (before, after)):
            return True
    return False


COLUMNS = ["change", "started", "run_id", "host", "preset", "test_id", "seed", "kind", "direction",
           "before", "after", "ratio", "ci_low", "ci_high", "previous_run"]


def findings_table(findings: list[Finding]) -> Table:
    rows = [(f.change, f.started, f.run_id, f.host, f.preset, f.test_id, f.seed, f.kind, f.direction,
             f.before, f.after, f.ratio, f.ci_low, f.ci_high, f.previous_run) for f in findings]
    return Table(list(COLUMNS), rows)


@dataclass
class ChangeGroup:
    """Every finding at one environment change, summed up per preset and kind."""

    change: str
    first_started: dt.datetime | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def regressions(self) -> int:
        return sum(f.direction == REGRESSION for f in self.findings)

    def lines(self) -> list[str]:
        """'3 tests stopped exporting on coreml_any_fp16', '11 tests 1.4x slower on ...'."""
        parts: dict[tuple[str, str, str], list[Finding]] = {}
        for f in self.findings:
            parts.setdefault((f.preset, f.kind, _phrase(f)), []).append(f)
        out = []
        order = {k: i for i, k in enumerate(KINDS)}
        for (preset, kind, phrase), fs in sorted(parts.items(), key=lambda kv: (order[kv[0][1]], kv[0])):
            tests = len({(f.test_id, f.seed) for f in fs})
            noun = "test" if tests == 1 else "tests"
            if kind == "latency":
                ratio = statistics.median(f.ratio for f in fs if f.ratio)
                phrase = f"{ratio:.2g}x slower" if ratio > 1 else f"{1 / ratio:.2g}x faster"
            elif kind == "metric":
                ratio = statistics.median(f.ratio for f in fs if f.ratio)
                phrase = f"error {'grew' if ratio > 1 else 'shrank'} {_magnitude(ratio)}"
            elif kind == "quantization":
                phrase = f"quantized {'worse' if phrase == REGRESSION else 'better'} (SQNR against the golden)"
            elif kind == "lowering":
                phrase = f"lowered {'further from' if phrase == REGRESSION else 'closer to'} the quantized reference"
            out.append(f"{tests} {noun} {phrase} on {preset}")
        return out

    def text(self) -> str:
        return f"{self.change}: " + "; ".join(self.lines())


def _phrase(f: Finding) -> str:
    if f.kind != "status":
        return f.direction
    try:
        after, before = Verdict(f.after), Verdict(f.before)
    except ValueError:
        return f"{f.before} -> {f.after}"
    if f.direction == IMPROVEMENT:
        return f"pass again (were {before.value})"
    return _STARTED.get(after, f"became {after.value}") + ("" if f.direction == REGRESSION
                                                         else f" (were {before.value})")


def _magnitude(ratio: float) -> str:
    r = ratio if ratio >= 1 else 1 / ratio
    return f"{r:.3g}x" if r < 1000 else f"1e{math.log10(r):.0f}x"


def group_by_change(findings: list[Finding]) -> list[ChangeGroup]:
    """Findings grouped by their environment change, in the order the changes first happened;
    those with no recorded change by their host and first run."""
    groups: dict[str, ChangeGroup] = {}
    for f in findings:
        # steps with no recorded change are told apart by where they happened
        label = f.change if f.changes else f"{UNATTRIBUTED} (host {f.host or '?'}, from run {f.run_id})"
        g = groups.setdefault(label, ChangeGroup(label, f.started))
        g.findings.append(f)
        if f.started is not None and (g.first_started is None or f.started < g.first_started):
            g.first_started = f.started
    far = dt.datetime.max
    return sorted(groups.values(), key=lambda g: (g.first_started or far, g.change))


def groups_table(groups: list[ChangeGroup]) -> Table:
    rows = [(g.change, g.first_started, g.regressions, len(g.findings), line)
            for g in groups for line in g.lines()]
    return Table(["change", "first_seen", "regressions", "findings", "what changed"], rows)
