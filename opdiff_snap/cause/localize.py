"""Where inside a module did the backend first go wrong: which submodule, which ATen op?

Every step below is a task for the worker pool; this module only decides what to run next.
The parent sees names, op names and tensors, never the suite's code.

1. Submodules. Capture the call tree on the baseline (cause.calls), then run every leaf
   submodule call alone on the target, on the baseline's inputs for that call, and compare
   with the baseline's output for it. The first call in execution order that is not PASS
   is where the divergence starts: every call before it reproduced the baseline from the
   baseline's own inputs.
2. The scope. When no leaf diverges (the bad op is a functional call in some `forward`),
   or when asked (`ops=True`), take the smallest divergent scope: the first divergent leaf,
   else the lowest enclosing call (the module itself included) whose output diverges
   while the calls directly inside it do not.
3. ATen nodes. Export that scope to core ATen the way the backends do, record every
   node's inputs and outputs on the baseline (cause.atengraph), and run each node alone
   on the target as a one-op module, in execution order. The first node that is not PASS
   is the answer (a node that crashes the backend is a CRASH there); how far its inputs
   had drifted when the graph up to it ran on the target is measured with one more job.
4. Ranges. When every node passes alone but the whole graph does not (the backend fuses
   or rewrites ops), bisect contiguous node ranges for the shortest one that diverges.

The pieces of each step run in batches, one program per batch (cause.together); a piece
that does not pass in its batch is run again alone, and that run is its verdict.

Only the backend protocol is used, so it works on any backend.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ..backends.base import Backend, Preset
from ..core.config import Settings
from ..core.errors import OpdiffError
from ..core.verdicts import LOWERING_FAILURES, NOT_DIVERGED, NOT_DIVERGED_CONVERTING, RAN, Verdict
from ..execution.pools import Pool, open_pool
from ..suite.model import Invocation, TestCase, Tolerance
from .alone import PieceResult, PieceTask
from .atengraph import Fragment, FragmentTask, GraphNode, NodeGraph, ScopeGraphTask, signature
from .calls import CallInfo, CallTree, CallTreeTask, SubmoduleTask
from .lowering import Survey, survey_graph
from .together import run_pieces


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
                "lowering": None if self.lowering is None else self.lowering.to_json()}

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
            where = f"in {_scope_label(ops.scope, ops.scope_class)}"
            lead = ("no submodule call diverges alone; " if self.first_divergent is None
                    else f"submodule '{self.first_divergent.label}' diverges; ")
            if f.is_range:
                ops_text = " -> ".join(n.target for n in f.nodes)
                what = (f"every node passes alone, but {f.label} ({ops_text}) {f.status} together "
                        f"{where}, from {'; '.join(f.sources()) or 'unknown source'}")
            else:
                what = (f"{f.status} at node {f.start} {where}: {f.nodes[0].target}({f.inputs}) -> {f.outputs}, "
                        f"from {f.nodes[0].source or 'unknown source'}")
            text = f"{head}: {lead}{what}. {_metrics_text(f.metrics)}"
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
            text += f" ATen nodes of {_scope_label(ops.scope, ops.scope_class)}: {ops.error or ops.note}"
        if low is not None and low.note:
            text += f" Lowering each op alone: {low.note}."
        return text


def _scope_label(scope: str, cls: str) -> str:
    return f"'{scope or '<root>'}' ({cls})" if cls else f"'{scope or '<root>'}'"


def _metrics_text(m: dict[str, Any]) -> str:
    if not m:
        return ""
    parts = [f"{k}={m[k]:.3g}" for k in ("max_abs", "max_rel") if isinstance(m.get(k), (int, float))]
    if m.get("numel"):
        parts.append(f"mismatched={m.get('mismatched', 0)}/{m['numel']}")
    return " ".join(parts)


# ---------------------------------------------------------------- the search


CONSTANT_NODE = "computed from weights and constants only (backends fold it at export); not run alone"


class _Search:
    """Runs localize's tasks on the pool; holds what every task needs."""

    def __init__(self, case: TestCase, invocation: Invocation, preset: Preset, tol: Tolerance,
                 pool: Pool, backend: Backend | None, baseline_precision: str, converts_only: bool = False,
                 cache_dir: Any = None):
        self.case, self.invocation, self.preset, self.tol = case, invocation, preset, tol
        self.pool, self.backend, self.baseline_precision = pool, backend, baseline_precision
        self.fine = NOT_DIVERGED_CONVERTING if converts_only else NOT_DIVERGED
        self.converts_only, self.cache_dir = converts_only, cache_dir

    def common(self, key: str) -> dict[str, Any]:
        return dict(key=key, case=self.case, preset=self.preset, tolerance=self.tol,
                    baseline_precision=self.baseline_precision, backend=self.backend)

    def one(self, task) -> Any:
        return next(iter(self.pool.run([task])))

    def all(self, tasks: Iterable[PieceTask], first_only: bool = False) -> dict[str, PieceResult]:
        """Each piece's result, the pieces run in batches (cause.together); `first_only`:
        stop at the first, in the order given, that does not pass."""
        return run_pieces(self.pool.run, list(tasks), self.fine, max(1, self.pool.n), first_only)

    # -------------------------------------------------------- submodules
    def submodules(self, calls: list[CallInfo], tree: list[CallInfo]) -> list[SubmoduleRow]:
        depth: dict[int, int] = {}
        for c in tree:
            depth[c.order] = 0 if c.parent is None else depth[c.parent] + 1
        done = self.all(SubmoduleTask(**self.common(str(c.order)), invocation=self.invocation, scope=c.scope)
                        for c in calls)
        rows = []
        for c in calls:
            r = done[str(c.order)]
            rows.append(SubmoduleRow(c.order, c.name, c.cls, r.status, r.metrics, r.text, c.leaf,
                                     depth[c.order], c.scope))
        return rows

    # -------------------------------------------------------- ATen nodes
    def fragment_task(self, key: str, scope: str, fragment: Fragment) -> FragmentTask:
        return FragmentTask(**self.common(key), fragment=fragment, scope=scope)

    def scan(self, graph: NodeGraph) -> tuple[dict[int, PieceResult], int | None]:
        """Run the nodes alone in order until the first that is not PASS (the nodes already
        handed to workers finish too)."""
        results: dict[int, PieceResult] = {}
        tasks = []
        for n in graph.nodes:
            if n.constant:
                results[n.index] = PieceResult(str(n.index), Verdict.SKIPPED, message=CONSTANT_NODE)
            else:
                tasks.append(self.fragment_task(str(n.index), graph.scope, graph.fragment(n.index, n.index)))
        results.update({int(k): r for k, r in self.all(tasks, first_only=True).items()})
        culprit = min((i for i, r in results.items() if r.status not in self.fine), default=None)
        if culprit is not None:   # past it, only what ran is reported
            results = {i: r for i, r in results.items() if i <= culprit or r.status is not Verdict.SKIPPED}
        return results, culprit

    def diverges(self, graph: NodeGraph, ranges: list[tuple[int, int]],
                 cache: dict[tuple[int, int], PieceResult], first_only: bool = False) -> None:
        """Run the ranges not in `cache` yet into it; `first_only`: past the first, in the
        order given, that does not pass, the ranges may be left out."""
        todo = [r for r in dict.fromkeys(ranges) if r not in cache]
        for a, b in todo:
            if all(n.constant for n in graph.nodes[a:b + 1]):
                cache[(a, b)] = PieceResult(f"{a}-{b}", Verdict.SKIPPED, message=CONSTANT_NODE)
        todo = [r for r in todo if r not in cache]
        done = self.all((self.fragment_task(f"{a}-{b}", graph.scope, graph.fragment(a, b)) for a, b in todo),
                        first_only)
        for a, b in todo:
            if f"{a}-{b}" in done:
                cache[(a, b)] = done[f"{a}-{b}"]

    def shortest_range(self, graph: NodeGraph, cache: dict[tuple[int, int], PieceResult]) -> tuple[int, int]:
        """Bisect for the shortest contiguous range that diverges: first the shortest
        prefix 0..j, then the latest start i with i..j still diverging. Each round probes
        as many points as the pool has workers."""
        width = max(1, self.pool.n)
        last = len(graph.nodes) - 1

        def bad(a: int, b: int) -> bool:
            return cache[(a, b)].status not in self.fine

        # only the shortest diverging prefix of a round matters: the longer ones are not rerun
        # alone to confirm that they diverge too (left out, they count as diverging)
        stop = _first_true(0, last, width,
                           lambda pts: self.diverges(graph, [(0, j) for j in pts], cache, first_only=True),
                           lambda j: (0, j) not in cache or bad(0, j))
        # g(i) = "i..stop passes"; g(stop) holds (every node passes alone), g(0) does not
        start = _first_true(1, stop, width,
                            lambda pts: self.diverges(graph, [(i, stop) for i in pts], cache),
                            lambda i: not bad(i, stop)) - 1
        return start, stop

    def drift(self, graph: NodeGraph, start: int) -> tuple[dict[str, Any] | None, str]:
        """How far the inputs of node `start` (the values it reads from earlier nodes) are
        off when the graph up to it runs on the target."""
        produced = {n.name for n in graph.nodes[:start] if not n.constant}
        reads = [r for r in graph.fragment(start, start).inputs if r.name in produced]
        if not reads:
            return None, "Its inputs are the scope's own inputs, exactly as the baseline computed them."
        r = self.one(self.fragment_task("drift", graph.scope, graph.fragment(0, start - 1, outputs=reads)))
        if r.status is Verdict.PASS:
            return r.metrics, (f"Its inputs came in within tolerance when the graph up to it ran on the target "
                               f"({_metrics_text(r.metrics)}).")
        if r.status in RAN:
            return r.metrics, (f"Its inputs had already diverged when the graph up to it ran on the target "
                               f"({r.status}: {_metrics_text(r.metrics)}).")
        return None, f"The graph up to it does not run on the target ({r.status}), so its inputs' drift is unknown."

    def survey(self) -> Survey:
        """Every op of the test's graph the preset cannot lower, each lowered alone, the
        probes spread over the pool."""
        from ..execution.op_support import OpSupportCache

        graph: NodeGraph = self.one(ScopeGraphTask(self.case, self.invocation, "",
                                                   bool(self.preset.options.get("export_strict")), core=False))
        if graph.error is not None:
            return Survey(self.preset.name, note=graph.error)
        cache = OpSupportCache(self.cache_dir) if self.cache_dir is not None else None
        return survey_graph(graph, self.preset, self.pool.run, cache, self.backend)

    def descend(self, scope: str, scope_class: str) -> OpsReport:
        ops = OpsReport(scope, scope_class)
        graph: NodeGraph = self.one(ScopeGraphTask(self.case, self.invocation, scope,
                                                   bool(self.preset.options.get("export_strict"))))
        if graph.error is not None:
            ops.error = graph.error
            return ops
        ops.node_count, ops.graph_vs_eager = len(graph.nodes), graph.graph_vs_eager
        if not graph.nodes:
            ops.note = "its ATen graph has no operator call (it only passes values through)."
            return ops
        results, culprit = self.scan(graph)
        for i in sorted(results):
            r, n = results[i], graph.nodes[i]
            ops.rows.append(NodeRow(n, r.status, *signature([n], graph.value), r.metrics, r.text))
        if culprit is not None:
            row = next(x for x in ops.rows if x.node.index == culprit)
            f = OpFinding(culprit, culprit, [row.node], row.status, row.inputs, row.outputs, row.metrics,
                          row.message)
            f.inputs_drift, f.inputs_note = self.drift(graph, culprit)
            ops.finding = f
            return ops
        cache: dict[tuple[int, int], PieceResult] = {}
        last = len(graph.nodes) - 1
        for i, r in results.items():
            cache[(i, i)] = r   # a constant node's SKIPPED counts as passing: it reads no activation
        self.diverges(graph, [(0, last)], cache)
        whole = cache[(0, last)]
        ops.whole_graph = whole.status
        if whole.status is Verdict.SKIPPED:
            ops.note = (f"all {len(graph.nodes)} nodes of the scope are computed from weights and constants "
                        "only (backends fold them at export): there is no op to run alone.")
            return ops
        if whole.status in self.fine:
            did = "convert" if whole.status is Verdict.UNAVAILABLE else "reproduce the baseline"
            ops.note = (f"all {len(graph.nodes)} nodes {did} alone, and so does the whole ATen "
                        "graph of the scope: the divergence comes from how the backend takes the module "
                        "itself (its own export path or decompositions), not from one op.")
            return ops
        start, stop = self.shortest_range(graph, cache)
        r = cache[(start, stop)]
        nodes = graph.nodes[start:stop + 1]
        f = OpFinding(start, stop, nodes, r.status, *signature(nodes, graph.value), r.metrics, r.text)
        f.inputs_drift, f.inputs_note = self.drift(graph, start)
        ops.finding = f
        return ops


def _first_true(lo: int, hi: int, width: int, probe: Callable[[list[int]], None],
                test: Callable[[int], bool]) -> int:
    """The smallest x in [lo, hi] with test(x), taking test(hi) as true and test as false
    then true along the way. `probe(points)` runs what `test` needs for those points, up to
    `width` points a round."""
    while lo < hi:
        k = min(width, hi - lo)
        points = sorted({lo + (hi - lo) * (i + 1) // (k + 1) for i in range(k)})
        probe(points)
        true = [p for p in points if test(p)]
        new_hi = min(true, default=hi)
        lo = max([p + 1 for p in points if p < new_hi and not test(p)], default=lo)
        hi = new_hi
    return lo


def _smallest_divergent(enclosing: list[SubmoduleRow], calls: list[CallInfo],
                        fine: frozenset[Verdict] = NOT_DIVERGED) -> SubmoduleRow | None:
    """The first enclosing call that diverges while no call directly inside it does."""
    status = {r.order: r.status for r in enclosing}
    children: dict[int, list[int]] = {}
    for c in calls:
        if c.parent is not None:
            children.setdefault(c.parent, []).append(c.order)
    for r in sorted(enclosing, key=lambda x: x.order):
        if r.status in fine:
            continue
        if all(status.get(ch, Verdict.PASS) in fine for ch in children.get(r.order, [])):
            return r
    return None


def localize(case: TestCase, invocation: Invocation, preset: Preset,
             tol_for: Callable[[Preset], Tolerance] | None = None, *, backend: Backend | None = None,
             pool: Pool | None = None, ops: bool = False, baseline_precision: str = "fp32",
             seed: int = 0, cache_dir: Any = None) -> LocalizeReport:
    """Find where `case` first diverges on `preset` (see the module docstring).

    `pool` runs every task (default: one isolated worker; this process when `backend` is
    given, as a test's own backend class may not be importable in a worker); `backend` replaces the
    registry's backend for the preset (tests pass their own; it travels with each task).
    `ops`: descend to ATen nodes even when a leaf submodule diverges. `cache_dir`: the
    artifact cache, whose op-support answers a lowering failure's survey reuses."""
    from ..compare.tolerance import tolerance_for

    if case.call.kind != "module" or case.pair is not None:
        raise OpdiffError(f"test '{case.id}' is a{'n op' if case.test_type == 'op' else ' pair'} test; "
                          "localize needs a module test (it hooks the module's submodules).")
    tol = tol_for(preset) if tol_for is not None else tolerance_for(case.tolerance, preset)
    own_pool = pool is None
    # isolated workers by default; a Backend object given here cannot travel to one, so it runs here
    pool = pool if pool is not None else open_pool(Settings(jobs=1), in_process=backend is not None)
    try:
        why = pool.unavailable(preset) if backend is None else backend.availability(preset).export_refusal()
        if why:
            raise OpdiffError(f"localize needs to run preset '{preset.name}', and {why}. Try it where the "
                              "preset is available.")
        from ..backends.registry import availability

        avail = backend.availability(preset) if backend is not None else availability(preset)
        search = _Search(case, invocation, preset, tol, pool, backend, baseline_precision,
                         converts_only=not avail.can_run, cache_dir=cache_dir)
        return _localize(search, ops, seed)
    finally:
        if own_pool:
            pool.close()


def _localize(search: _Search, ops: bool, seed: int) -> LocalizeReport:
    case = search.case
    report = LocalizeReport(case.id, search.preset.name, search.tol, [], None, seed=seed,
                            converts_only=search.converts_only)
    tree: CallTree = search.one(CallTreeTask(case, search.invocation))
    if tree.error is not None:
        report.error = tree.error
        return report
    calls = tree.calls
    leaves = [c for c in calls if c.leaf]
    report.rows = search.submodules(leaves, calls)
    report.first_divergent = next((r for r in report.rows if not report.passes(r.status)), None)
    scope: SubmoduleRow | None = report.first_divergent
    if scope is None:
        report.enclosing = search.submodules([c for c in calls if not c.leaf], calls)
        scope = _smallest_divergent(report.enclosing, calls, search.fine)
    if scope is None:
        return report
    if scope.status in LOWERING_FAILURES:
        # the op-level answer to a test that does not lower: every op that fails alone
        report.lowering = search.survey()
        if report.lowering.ops:
            return report
    # below a leaf that diverges only when asked; below the module itself (no submodule
    # diverges, or it has none) by default: nothing else can be learned above the op
    if scope is report.first_divergent and scope.name and not ops:
        return report
    report.ops = search.descend(scope.scope, scope.cls)
    return report


# ---------------------------------------------------------------- the report as text

def _fmt(v: Any) -> str:
    return f"{v:10.3g}" if isinstance(v, (int, float)) else f"{'-':>10}"


def format_report(report: LocalizeReport, context: int = 3) -> str:
    """Plain text: every submodule call run (the first divergent marked '>'), then the ATen
    nodes run in the scope (the passing ones before the finding elided down to `context`),
    the finding, and the command that writes its repro."""
    if report.error is not None:
        return f"{report.test_id} on {report.preset}: localize failed: {report.error}"
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
        lines.append(f"ATen nodes of {_scope_label(ops.scope, ops.scope_class)}: {ops.node_count} "
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
