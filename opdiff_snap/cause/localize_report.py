"""What localize found (cause/localize.py) and how it is shown: the pieces run, the
finding, the ops a preset cannot lower; as a one-line summary, JSON and text."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from ..core.verdicts import NOT_DIVERGED, NOT_DIVERGED_CONVERTING, RAN, Verdict
from ..execution.atengraph import GraphNode
from ..execution.op_support import Survey
from ..suite.model import Tolerance
from .quantized_graph import QuantizedSearch

CONSTANT_NODE = "computed from weights and constants only (backends fold it at export); not run alone"


@dataclass
class SubmoduleRow:
    order: int
    name: str
    cls: str
    status: Verdict
    metrics: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    leaf: bool = True
    depth: int = 0
    scope: str = ""            # how `opdiff repro --scope` names this call

    @property
    def failed_to_run(self) -> bool:
        """True when export/load/run failed (no output to compare), not a numeric mismatch."""
        return self.status not in RAN

    @property
    def label(self) -> str:
        return self.name or "<root>"


@dataclass
class NodeRow:
    """One ATen node run alone on the target."""

    node: GraphNode
    status: Verdict
    inputs: str
    outputs: str
    metrics: dict[str, Any] = field(default_factory=dict)
    message: str = ""


@dataclass
class OpFinding:
    """The first ATen node (or the shortest node range) of the scope that diverges alone."""

    start: int
    stop: int
    nodes: list[GraphNode]
    status: Verdict
    inputs: str                  # what it reads (its first node): shapes, dtypes, constants
    outputs: str                 # what it produces (its last node)
    metrics: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    inputs_drift: dict[str, Any] | None = None   # its inputs when the graph up to it ran on the target
    inputs_note: str = ""

    @property
    def is_range(self) -> bool:
        return self.stop > self.start

    @property
    def label(self) -> str:
        if self.is_range:
            return f"nodes {self.start}-{self.stop}"
        return f"node {self.start} ({self.nodes[0].target})"

    @property
    def node_arg(self) -> str:
        """What `opdiff repro --node` takes for it."""
        return f"{self.start}-{self.stop}" if self.is_range else str(self.start)

    def sources(self) -> list[str]:
        """The distinct source lines of its nodes, in order."""
        return list(dict.fromkeys(n.source for n in self.nodes if n.source))


@dataclass
class OpsReport:
    """What the descent to ATen nodes found in one scope."""

    scope: str                      # "" (the module itself), "name" or "name#k"
    scope_class: str
    node_count: int = 0
    rows: list[NodeRow] = field(default_factory=list)   # the nodes that ran, by index
    finding: OpFinding | None = None
    whole_graph: Verdict | None = None   # the whole ATen graph of the scope on the target
    graph_vs_eager: float | None = None
    note: str = ""                  # why there is no finding
    error: str | None = None        # why the scope could not be descended into


@dataclass
class LocalizeReport:
    test_id: str
    preset: str
    tolerance: Tolerance
    rows: list[SubmoduleRow]                # the leaf submodule calls, in execution order
    first_divergent: SubmoduleRow | None    # first leaf row that is not PASS
    error: str | None = None                # why localize could not run
    enclosing: list[SubmoduleRow] = field(default_factory=list)   # enclosing calls run to find the scope
    ops: OpsReport | None = None
    seed: int = 0
    preset_options: str | None = None       # as given, for the repro command
    converts_only: bool = False             # the preset converts here but cannot run (CoreML off macOS)
    lowering: Survey | None = None          # the test failed to lower: every op that fails alone
    quantized: QuantizedSearch | None = None   # an int8 preset: the quantized graph's points probed

    def to_json(self) -> dict[str, Any]:
        """What `opdiff localize --format json` prints: the verdicts of the pieces run, the
        finding, and the ops the preset cannot lower."""
        def row(r: SubmoduleRow) -> dict[str, Any]:
            return {"order": r.order, "scope": r.scope, "class": r.cls, "leaf": r.leaf, "status": r.status.value,
                    "metrics": r.metrics, "message": r.message}

        finding = None
        if self.ops is not None and self.ops.finding is not None:
            f = self.ops.finding
            finding = {"scope": self.ops.scope, "start": f.start, "stop": f.stop, "status": f.status.value,
                       "ops": [n.target for n in f.nodes], "sources": f.sources(), "inputs": f.inputs,
                       "outputs": f.outputs, "metrics": f.metrics, "message": f.message}
        return {"test": self.test_id, "preset": self.preset, "seed": self.seed, "divergence": self.divergence,
                "summary": self.summary(), "converts_only": self.converts_only,
                "first_divergent": None if self.first_divergent is None else self.first_divergent.scope,
                "submodules": [row(r) for r in sorted(self.rows + self.enclosing, key=lambda x: x.order)],
                "node": finding, "repro": self.repro_command(),
                "lowering": None if self.lowering is None else self.lowering.to_json(),
                "quantized": None if self.quantized is None else self.quantized.to_json()}

    def passes(self, status: Verdict) -> bool:
        """A piece that does not mark where the divergence starts: it matched, or, where the
        preset only converts here, it converted."""
        return status in (NOT_DIVERGED_CONVERTING if self.converts_only else NOT_DIVERGED)

    @property
    def divergence(self) -> str:
        """'none', 'mismatch' (ran, output outside tolerance) or 'failed' (export/load/run
        failed, crashed or hung), for the deepest thing found."""
        if self.ops is not None and self.ops.finding is not None:
            return "mismatch" if self.ops.finding.status in RAN else "failed"
        q = self.quantized
        if q is not None:
            if q.finding is None:
                return "none"
            return "mismatch" if q.results[q.finding].status in RAN else "failed"
        if self.lowering is not None and self.lowering.ops:
            return "failed"
        row = self.first_divergent or next((r for r in self.enclosing if not self.passes(r.status)), None)
        if row is None:
            return "none"
        return "failed" if row.failed_to_run else "mismatch"

    @property
    def found(self) -> bool:
        return self.divergence != "none"

    def repro_command(self) -> str | None:
        """The `opdiff repro` command for the node (range) found, if any."""
        if self.ops is None or self.ops.finding is None:
            return None
        parts = ["opdiff", "repro", shlex.quote(self.test_id), "-b", self.preset]
        if self.seed:
            parts += ["--seed", str(self.seed)]
        if self.preset_options:
            parts += ["--preset-options", shlex.quote(self.preset_options)]
        if self.ops.scope:
            parts += ["--scope", shlex.quote(self.ops.scope)]
        parts += ["--node", self.ops.finding.node_arg]
        return " ".join(parts)

    def summary(self) -> str:
        head = f"{self.test_id} on {self.preset}"
        if self.quantized is not None:
            return f"{head}: {quantized_summary(self.quantized)}"
        ops = self.ops
        low = self.lowering
        if low is not None and low.ops:
            names = ", ".join(f"{u.op} (x{u.count})" for u in low.ops)
            first = low.ops[0]
            return (f"{head}: {self.preset} cannot lower {len(low.ops)} op{'s' if len(low.ops) > 1 else ''} of "
                    f"the test, each tried alone: {names}; the first from "
                    f"{first.sources[0] if first.sources else 'unknown source'}.")
        if ops is not None and ops.finding is not None:
            f = ops.finding
            where = f"in {scope_label(ops.scope, ops.scope_class)}"
            lead = ("no submodule call diverges alone; " if self.first_divergent is None
                    else f"submodule '{self.first_divergent.label}' diverges; ")
            if f.is_range:
                ops_text = " -> ".join(n.target for n in f.nodes)
                what = (f"every node passes alone, but {f.label} ({ops_text}) {f.status} together "
                        f"{where}, from {'; '.join(f.sources()) or 'unknown source'}")
            else:
                what = (f"{f.status} at node {f.start} {where}: {f.nodes[0].target}({f.inputs}) -> {f.outputs}, "
                        f"from {f.nodes[0].source or 'unknown source'}")
            text = f"{head}: {lead}{what}. {metrics_text(f.metrics)}"
            if f.inputs_note:
                text += f" {f.inputs_note}"
            return text.strip()
        if self.first_divergent is not None:
            r = self.first_divergent
            what = "fails to run" if r.failed_to_run else "diverges"
            text = (f"{head}: first divergent submodule is '{r.name or '<root>'}' "
                    f"({r.cls}, call #{r.order}), which {what}: {r.status}. {r.message}").strip()
        else:
            enclosing = [r for r in self.enclosing if not self.passes(r.status)]
            if not enclosing:
                if self.converts_only:
                    return (f"{head}: all {len(self.rows) + len(self.enclosing)} submodule calls convert "
                            "(this machine cannot run the preset, so only conversion was tested).")
                return (f"{head}: all {len(self.rows) + len(self.enclosing)} submodule calls reproduce the "
                        "baseline within tolerance.")
            text = (f"{head}: no leaf submodule diverges alone; "
                    f"{', '.join(repr(r.label) for r in enclosing)} diverge"
                    f"{'s' if len(enclosing) == 1 else ''}.")
        if ops is not None:
            text += f" ATen nodes of {scope_label(ops.scope, ops.scope_class)}: {ops.error or ops.note}"
        if low is not None and low.note:
            text += f" Lowering each op alone: {low.note}."
        return text


def quantized_summary(q: QuantizedSearch) -> str:
    if q.finding is None:
        return q.note
    p, r = q.points[q.finding], q.results[q.finding]
    n = p.index
    did = "convert," if q.converts_only else f"{'are' if n > 1 else 'is'} within {q.steps:g} steps,"
    before = (f"the {n} point{'s' if n > 1 else ''} before it {did} each lowered up to "
              f"{'itself' if n == 1 else 'themselves'}" if n else "it is the first")
    if r.status in RAN:
        what = (f"the lowering error starts at quantized point {p.index} of {len(q.points)} ({p.node}, "
                f"{_steps(r.metrics)}); {before}")
    else:
        what = f"the quantized graph up to point {p.index} of {len(q.points)} ({p.node}) fails: {r.status}; {before}"
    where = f", from {p.source}" if p.source else ""
    inside = f" in {p.module}" if p.module else ""
    return f"{what}. It computes {p.label}{inside}{where}."


def _steps(m: dict[str, Any]) -> str:
    parts = []
    if isinstance(m.get("lowering_steps"), (int, float)):
        parts.append(f"up to {m['lowering_steps']:.3g} steps")
    if isinstance(m.get("lowering_bias"), (int, float)):
        parts.append(f"mean {m['lowering_bias']:.3g} steps")
    return ", ".join(parts)


def scope_label(scope: str, cls: str) -> str:
    return f"'{scope or '<root>'}' ({cls})" if cls else f"'{scope or '<root>'}'"


def metrics_text(m: dict[str, Any]) -> str:
    if not m:
        return ""
    parts = [f"{k}={m[k]:.3g}" for k in ("max_abs", "max_rel") if isinstance(m.get(k), (int, float))]
    if m.get("numel"):
        parts.append(f"mismatched={m.get('mismatched', 0)}/{m['numel']}")
    return " ".join(parts)


# ---------------------------------------------------------------- the report as text

def _fmt(v: Any) -> str:
    return f"{v:10.3g}" if isinstance(v, (int, float)) else f"{'-':>10}"


def format_report(report: LocalizeReport, context: int = 3) -> str:
    """Plain text: every submodule call run (the first divergent marked '>'), then the ATen
    nodes run in the scope (the passing ones before the finding elided down to `context`),
    the finding, and the command that writes its repro."""
    if report.error is not None:
        return f"{report.test_id} on {report.preset}: localize failed: {report.error}"
    if report.quantized is not None:
        return "\n".join(_quantized_lines(report.quantized, report.preset, context) + ["", report.summary()])
    head = f"{'':1} {'#':>3}  {'submodule':<30} {'class':<18} {'status':<14} {'max_abs':>10} {'max_rel':>10}"
    lines = [head, "-" * len(head)]
    mark_row = report.first_divergent
    if mark_row is None and report.ops is not None:
        mark_row = next((r for r in report.enclosing if r.scope == report.ops.scope), None)
    for r in sorted(report.rows + report.enclosing, key=lambda x: x.order):
        mark = ">" if r is mark_row else ""
        name = "  " * r.depth + r.label + ("" if r.leaf or not r.name else "/")
        lines.append(f"{mark:1} {r.order:>3}  {name:<30} {r.cls:<18} {str(r.status):<14} "
                     f"{_fmt(r.metrics.get('max_abs'))} {_fmt(r.metrics.get('max_rel'))}")
    ops = report.ops
    if ops is not None and ops.rows:
        lines.append("")
        folded = sum(x.status is Verdict.SKIPPED for x in ops.rows)
        lines.append(f"ATen nodes of {scope_label(ops.scope, ops.scope_class)}: {ops.node_count} "
                     f"(core ATen, as the backends export it; on the baseline the graph reproduces the "
                     f"scope's eager output to max_abs {ops.graph_vs_eager or 0:.3g}); "
                     f"{len(ops.rows) - folded} run alone on {report.preset}"
                     + (f"; {folded} SKIPPED: {CONSTANT_NODE}" if folded else ""))
        nh = f"{'':1} {'node':>4}  {'op':<34} {'status':<14} {'max_abs':>10} {'max_rel':>10}  source"
        lines += [nh, "-" * len(nh)]
        f = ops.finding
        culprit = f.start if f is not None and not f.is_range else None
        if f is not None:
            keep = [x for x in ops.rows
                    if not report.passes(x.status) or f.start - context <= x.node.index <= f.stop]
        else:
            keep = [x for x in ops.rows if not report.passes(x.status)]
        before = [x for x in ops.rows if x not in keep and (f is None or x.node.index < f.start)]
        if before:
            span = f"{before[0].node.index}-{before[-1].node.index}"
            lines.append(f"  {'...':>4}  {len(before)} nodes pass alone ({span})")
        show = keep
        for x in show:
            mark = ">" if x.node.index == culprit else ""
            lines.append(f"{mark:1} {x.node.index:>4}  {x.node.target:<34} {str(x.status):<14} "
                         f"{_fmt(x.metrics.get('max_abs'))} {_fmt(x.metrics.get('max_rel'))}  {x.node.source}")
        if f is not None:
            lines.append("")
            if f.is_range:
                lines.append(f"{f.label} diverge together ({f.status}), each node alone passes:")
                for n in f.nodes:
                    lines.append(f"  {n.index:>4}  {n.target:<34} {n.module:<22} {n.source}")
            else:
                n = f.nodes[0]
                lines.append(f"{f.status} at node {f.start}: {n.target}({f.inputs}) -> {f.outputs}")
                lines.append(f"  source: {n.source_path or '?'}  ({n.source or 'no stack trace'})")
                if n.module:
                    lines.append(f"  inside: {n.module}")
            if f.message:
                lines.append(f"  {f.message.splitlines()[0][:400]}")
            if f.inputs_note:
                lines.append(f"  {f.inputs_note}")
    if report.lowering is not None:
        lines += _lowering_lines(report.lowering, report.preset)
    lines.append("")
    lines.append(report.summary())
    cmd = report.repro_command()
    if cmd:
        lines.append(f"Reproduce it alone: {cmd} -o repro_node.py")
    return "\n".join(lines)


def _lowering_lines(low: Survey, preset: str) -> list[str]:
    """The ops a test's graph holds that `preset` cannot lower, each with its source."""
    cached = low.calls - low.asked
    lines = ["", f"Each op of the test's ATen graph lowered alone on {preset}: {low.calls} distinct op calls, "
                 f"{low.asked} lowered now, {cached} answered from the op-support cache ({low.seconds:.1f} s)."]
    if not low.ops:
        return lines + [f"  {low.note}"]
    head = f"  {'op':<34} {'nodes':>5}  {'stage':<12} source"
    lines += [head, "  " + "-" * (len(head) - 2)]
    for u in low.ops:
        lines.append(f"  {u.op:<34} {u.count:>5}  {u.stage:<12} {u.sources[0] if u.sources else '?'}")
        if u.modules:
            lines.append(f"  {'':<34} {'':>5}  {'':<12} in {', '.join(u.modules[:3])}")
        if u.source_paths:
            lines.append(f"  {'':<34} {'':>5}  {'':<12} at {u.source_paths[0]}")
        lines.append(f"  {'':<34} {'':>5}  {'':<12} {u.error.splitlines()[0][:200] if u.error else ''}")
    return lines


def _quantized_lines(q: QuantizedSearch, preset: str, context: int) -> list[str]:
    """The quantized graph's points probed: each lowered up to itself on `preset` and judged
    in steps of its scale (the passing ones before the finding elided down to `context`)."""
    lines = [f"Quantized points of the int8 graph: {len(q.points)}; each lowered up to itself on {preset}, "
             f"judged in steps of its scale (tolerance {q.steps:g} steps)."]
    head = f"{'':1} {'#':>4}  {'status':<14} {'steps':>8} {'bias':>8} {'scale':>10}  computes"
    lines += [head, "-" * len(head)]
    ran = [p for p in q.points if p.index in q.results]
    stop = q.finding if q.finding is not None else len(q.points)
    hidden = [p for p in ran if p.index < stop - context and q.results[p.index].status is Verdict.PASS]
    if hidden:
        lines.append(f"  {'...':>4}  {len(hidden)} points within tolerance ({hidden[0].index}-{hidden[-1].index})")
    for p in ran:
        if p in hidden:
            continue
        r = q.results[p.index]
        m = r.metrics
        mark = ">" if p.index == q.finding else ""
        scale = f"{p.scale:10.3g}" if p.scale else f"{'range':>10}"
        inside = f" in {p.module}" if p.module else ""
        lines.append(f"{mark:1} {p.index:>4}  {str(r.status):<14} {_fmt8(m.get('lowering_steps'))} "
                     f"{_fmt8(m.get('lowering_bias'))} {scale}  {p.label}{inside}")
        if p.index == q.finding:
            if p.source:
                lines.append(f"  {'':>4}  source: {p.source_path or '?'}  ({p.source})")
            if r.text:
                lines.append(f"  {'':>4}  {r.text.splitlines()[0][:400]}")
    return lines


def _fmt8(v: Any) -> str:
    return f"{v:8.3g}" if isinstance(v, (int, float)) else f"{'-':>8}"
