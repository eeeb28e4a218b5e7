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
   node's inputs and outputs on the baseline (execution.atengraph), and run each node alone
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

from pathlib import Path
from typing import Any, Callable, Iterable

from ..backends.base import Backend, Preset
from ..backends.registry import availability, backend_for, get_preset
from ..compare.int8_errors import STEPS
from ..compare.tolerance import tolerance_for
from ..core.config import Settings
from ..core.errors import OpdiffError
from ..core.verdicts import LOWERING_FAILURES, NOT_DIVERGED, NOT_DIVERGED_CONVERTING, RAN, Verdict
from ..execution.atengraph import Fragment, NodeGraph, signature
from ..execution.op_support import Survey
from ..execution.op_survey import survey_graph
from ..execution.pools import Pool, make_pool, open_pool
from ..suite.model import Invocation, TestCase, Tolerance
from .alone import FragmentTask, PieceResult, PieceTask
from .calls import CallInfo, CallTree, CallTreeTask, ScopeGraphTask, SubmoduleTask
from .localize_report import CONSTANT_NODE, LocalizeReport, NodeRow, OpFinding, OpsReport, SubmoduleRow, metrics_text
from .quantized_graph import Point, PointTask, QuantizedGraph, QuantizedGraphTask, QuantizedSearch
from .stored import golden_case
from .together import run_pieces


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

    # -------------------------------------------------------- int8: the quantized graph
    def points(self, points: list[Point], seed: int) -> QuantizedSearch:
        """Probe the quantized graph's points in order, up to the first beyond its steps."""
        allowed = self.tol.steps if self.tol.steps is not None else STEPS.get(self.preset.precision, 2.0)
        if not points:
            return QuantizedSearch([], {}, None, allowed, note="the quantized graph quantizes no activation, so "
                                   "it has no point to probe.")
        tasks = [PointTask(str(p.index), self.case, self.invocation, seed, self.preset, self.tol, self.backend, p)
                 for p in points]
        # one piece a task: a part of the quantized graph is lowered as the whole model is
        done = run_pieces(self.pool.run, tasks, self.fine, max(1, self.pool.n), first_only=True, most=1)
        results = {int(k): r for k, r in done.items()}
        finding = min((i for i, r in results.items() if r.status not in self.fine), default=None)
        if finding is not None:
            results = {i: r for i, r in results.items() if i <= finding}
        if finding is not None:
            note = ""
        elif self.converts_only:
            note = (f"the quantized graph converts cut after each of its {len(points)} points (this machine cannot "
                    "run the preset, so only conversion was tested).")
        else:
            note = (f"all {len(points)} quantized points are within {allowed:g} steps of the quantized graph, each "
                    "lowered up to it.")
        return QuantizedSearch(points, results, finding, allowed, note, self.converts_only)

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
                               f"({metrics_text(r.metrics)}).")
        if r.status in RAN:
            return r.metrics, (f"Its inputs had already diverged when the graph up to it ran on the target "
                               f"({r.status}: {metrics_text(r.metrics)}).")
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
    if case.call.kind != "module" or case.pair is not None:
        raise OpdiffError(f"test '{case.id}' is a{'n op' if case.test_type == 'op' else ' pair'} test; "
                          "localize needs a module test (it hooks the module's submodules).")
    if preset.scheme is not None and not (backend or backend_for(preset)).steps_through_quantized(preset):
        raise OpdiffError(f"localize of int8 preset '{preset.name}' steps through the quantized model as a torch "
                          f"graph, and the {preset.family} backend's quantized model is not one (it quantizes with "
                          "tools of its own). The result's lowering_steps and quant_sqnr say which error it is; "
                          "localize the test on an ExecuTorch or inductor int8 preset, or on its float preset.")
    tol = tol_for(preset) if tol_for is not None else tolerance_for(case.tolerance, preset)
    own_pool = pool is None
    # isolated workers by default; a Backend object given here cannot travel to one, so it runs here
    pool = pool if pool is not None else open_pool(Settings(jobs=1), in_process=backend is not None)
    try:
        why = pool.unavailable(preset) if backend is None else backend.availability(preset).export_refusal()
        if why:
            raise OpdiffError(f"localize needs to run preset '{preset.name}', and {why}. Try it where the "
                              "preset is available.")
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
    if search.preset.scheme is not None:
        graph: QuantizedGraph = search.one(QuantizedGraphTask("graph", case, search.invocation, seed,
                                                               search.preset, search.backend))
        if graph.error is not None:
            report.error = graph.error
        else:
            report.quantized = search.points(graph.points, seed)
        return report
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



def localize_golden(test_id: str, backend: str, *, seed: int = 0, preset_options=None,
                    goldens: Path | str = Path("goldens"), ops: bool = False, tolerance=None,
                    settings: Settings | None = None, in_process: bool = False, trust_goldens: bool = False,
                    python: Path | None = None) -> LocalizeReport:
    """`opdiff localize`: localize() on a stored golden, its case rebuilt under the trust
    rules. `tolerance` overrides the test's field by field, as check's does. Every step
    runs in the pool of `settings` (executor, jobs, timeout_s), its workers under `python`
    when given."""
    settings = settings or Settings()
    case, golden = golden_case(test_id, seed, goldens, trust_goldens, settings.suites)
    preset = get_preset(backend, preset_options)
    with make_pool(settings, in_process, python=python) as pool:
        report = localize(case, golden.invocation, preset, lambda p: tolerance_for(case.tolerance, p, tolerance),
                          pool=pool, ops=ops, seed=seed,
                          baseline_precision=str(golden.baseline.get("precision") or "fp32"),
                          cache_dir=settings.cache)
    if report.error is not None:
        raise OpdiffError(f"test '{test_id}' on {backend}: {report.error}")
    if isinstance(preset_options, str):
        report.preset_options = preset_options
    return report
