"""Where inside an int8 model the lowering error starts: localize on a quantizing preset.

An int8 result's lowering error is the backend against the quantized reference, the
model after quantization and before lowering. For a backend whose quantized model is a
torch graph (PT2E's converted module: Backend.quantize), that graph says where every
activation is quantized, and with what step. Each such point (a dequantize of a computed
value; with dynamic activations, the op that takes one) is a probe: the graph up to it,
lowered exactly as the whole model is (Backend.lower_quantized), run on the golden's
inputs, and judged against the graph's own value there in steps of that point's scale
(compare.int8_errors.judge_int8). The first point, in execution order, that is beyond the
test's steps is where the lowering error starts; the ops between it and the points
before it are what the backend computes differently.

The model is quantized once per worker from the test's calibration data (calibration is
data: every worker draws the same samples), so every probe cuts the same graph. Pieces
are never quantized apart.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..backends.base import Backend, Preset, QuantizeFailed
from ..core.sources import source_line
from ..core.verdicts import Verdict
from ..execution.atengraph import module_label
from ..execution.job import WorkerContext
from ..suite.model import Invocation, TestCase, Tolerance
from .alone import PieceResult

_QUANTIZE_OPS = ("quantize_per_tensor", "quantize_per_channel", "quantize_affine", "choose_qparams")


@dataclass
class Point:
    """A quantized activation of the graph: the dequantize `node` of a computed value, the
    ops that computed it from the points before it (`ops`, with the first one's source and
    module), and its step (None where the scale is computed as the model runs)."""

    index: int
    node: str
    ops: list[str]
    source: str
    source_path: str
    module: str
    scale: float | None

    @property
    def label(self) -> str:
        return " -> ".join(self.ops) or self.node


@dataclass
class QuantizedGraph:
    """What the graph task found: the points in execution order, or why there are none."""

    points: list[Point] = field(default_factory=list)
    error: str | None = None


@dataclass
class QuantizedSearch:
    """localize on an int8 preset: every point probed (in order, up to the first that fails),
    and that point (`finding`, an index into `points`)."""

    points: list[Point]
    results: dict[int, PieceResult]
    finding: int | None
    steps: float
    note: str = ""
    converts_only: bool = False   # the preset converts here but cannot run: the points were converted only

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "note": self.note,
                "finding": None if self.finding is None else self.points[self.finding].node,
                "points": [{"index": p.index, "node": p.node, "ops": p.ops, "source": p.source,
                            "module": p.module, "scale": p.scale,
                            "status": self.results[p.index].status.value if p.index in self.results else None,
                            "metrics": self.results[p.index].metrics if p.index in self.results else None}
                           for p in self.points]}


# ---------------------------------------------------------------- the graph

def _is(node: Any, name: str) -> bool:
    return getattr(node, "op", None) == "call_function" and name in str(node.target)


def _dequantizes(node: Any) -> bool:
    return _is(node, "dequantize")


def _quantizes(node: Any) -> bool:
    return (getattr(node, "op", None) == "call_function" and not _dequantizes(node)
            and any(q in str(node.target) for q in _QUANTIZE_OPS))


def _constant(gm: torch.fx.GraphModule, raw: Any) -> float | None:
    if getattr(raw, "op", None) == "get_attr":
        raw = getattr(gm, str(raw.target))
    if isinstance(raw, torch.Tensor) and raw.numel() == 1:
        raw = float(raw)
    return float(raw) if isinstance(raw, (int, float)) and raw > 0 else None


def _op_name(node: torch.fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).replace(".default", "")


def _segment(ends: list[torch.fx.Node], stop: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """The compute nodes that lead to `ends` since the last dequantize, input or node of
    `stop` (the points before them), in order."""
    seen: dict[torch.fx.Node, None] = {}
    todo = list(ends)
    while todo:
        n = todo.pop()
        if n in seen or n.op != "call_function" or _dequantizes(n) or (n in stop and n not in ends):
            continue
        seen[n] = None
        todo += [a for a in n.all_input_nodes]
    order = {n: i for i, n in enumerate(ends[0].graph.nodes)}
    return sorted((n for n in seen if not _quantizes(n)), key=order.__getitem__)


def points_of(gm: torch.fx.GraphModule) -> list[Point]:
    """The graph's quantized activations. Where the scale is fixed (static activations),
    each dequantize of a value the graph computed (not an input, not a weight) is a point.
    Where it is computed as the model runs (dynamic), the quantize and dequantize belong to
    the op that takes them (a delegate lowers them only with it), so the points are that
    op's outputs, in float, inputs quantized included."""
    # point: (where its ops end, its scale); static: a value's first dequantize only (PT2E
    # gives each user of a quantized value a dequantize of its own)
    found: dict[torch.fx.Node, tuple[list[torch.fx.Node], float | None]] = {}
    taken: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if not _dequantizes(node) or not node.args or not _quantizes(node.args[0]):
            continue
        quantize = node.args[0]
        value = quantize.args[0] if quantize.args else None
        if not isinstance(value, torch.fx.Node) or value.op not in ("call_function", "placeholder"):
            continue
        scale = _constant(gm, quantize.args[1]) if len(quantize.args) > 1 else None
        if scale is not None:
            if value.op == "call_function" and quantize not in taken:   # an input quantized: nothing computed it
                taken.add(quantize)
                found[node] = ([value], scale)
            continue
        for user in node.users:   # dynamic: the op that takes it, with what led to its input
            if user.op == "call_function" and not _dequantizes(user) and not _quantizes(user):
                found.setdefault(user, ([value, user], None))
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    stop = set(found)
    points: list[Point] = []
    for node in sorted(found, key=order.__getitem__):
        ends, scale = found[node]
        ops = _segment(ends, stop)
        if not ops:
            continue
        main = ops[0] if scale is not None else ops[-1]   # what the quantizer annotated
        source, path = source_line(main.meta.get("stack_trace"))
        points.append(Point(len(points), node.name, [_op_name(n) for n in ops], source, path,
                            module_label(main.meta), scale))
    return points


def cut_at(gm: torch.fx.GraphModule, node_name: str) -> torch.fx.GraphModule:
    """A copy of `gm` that ends at `node_name` (its one output), everything after it gone;
    its weights are copies, so a backend may change them."""
    cut = copy.deepcopy(gm)
    graph = cut.graph
    node = next(n for n in graph.nodes if n.name == node_name)
    output = next(n for n in graph.nodes if n.op == "output")
    output.args = ((node,),)
    graph._codegen = torch.fx.graph.CodeGen()   # flat inputs, a tuple out: the output spec changed
    graph.eliminate_dead_code()
    graph.lint()
    cut.recompile()
    return cut


# ---------------------------------------------------------------- in the worker

_MADE: dict[tuple, tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]] = {}


def _quantized(case: TestCase, invocation: Invocation, seed: int, preset: Preset,
               backend: Backend) -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """The test's quantized graph and its inputs, made once per worker (the last one kept)."""
    import json

    from ..execution.int8_reference import calibration_inputs
    from ..execution.prepare import flat_module

    key = (case.id, seed, preset.name, json.dumps(preset.options, sort_keys=True, default=str), type(backend))
    if key not in _MADE:
        prepared = flat_module(case, invocation)
        inputs = tuple(prepared.fresh_inputs())
        try:
            samples = calibration_inputs(case, invocation, seed, int(preset.options.get("calibration_samples") or 1))
        except Exception as exc:
            raise QuantizeFailed(f"drawing the calibration inputs failed: {type(exc).__name__}: {exc}") from exc
        with torch.no_grad():
            module, _ = backend.quantize(prepared.module, inputs, samples, preset)
        if not isinstance(module, torch.fx.GraphModule):
            raise QuantizeFailed(f"the quantized model is a {type(module).__name__}, not a torch.fx graph")
        _MADE.clear()
        _MADE[key] = (module, inputs)
    return _MADE[key]


def _backend(preset: Preset, backend: Backend | None) -> Backend:
    from ..backends.registry import backend_for

    return backend if backend is not None else backend_for(preset)


@dataclass
class QuantizedGraphTask:
    """Quantize the test as its preset does and list the graph's points."""

    key: str
    case: TestCase
    invocation: Invocation
    seed: int
    preset: Preset
    backend: Backend | None

    def run(self, context: WorkerContext = WorkerContext()) -> QuantizedGraph:
        from ..core.errors import error_text

        try:
            gm, _ = _quantized(self.case, self.invocation, self.seed, self.preset, _backend(self.preset, self.backend))
        except QuantizeFailed as exc:
            return QuantizedGraph(error=f"quantizing failed: {exc}")
        except Exception as exc:
            return QuantizedGraph(error=f"quantizing failed: {error_text(exc)}")
        return QuantizedGraph(points_of(gm))

    def failed(self, status: Verdict, error_class: str | None, message: str) -> QuantizedGraph:
        return QuantizedGraph(error=f"{status.value}: {message}")


@dataclass
class PointTask:
    """Lower the quantized graph up to one point, run it, and judge it against the graph's
    own value there, in steps of the point's scale."""

    key: str
    case: TestCase
    invocation: Invocation
    seed: int
    preset: Preset
    tolerance: Tolerance
    backend: Backend | None
    point: Point

    def run(self, context: WorkerContext = WorkerContext()) -> PieceResult:
        from ..compare.int8_errors import judge_int8
        from ..core.errors import error_text

        backend = _backend(self.preset, self.backend)
        try:
            gm, inputs = _quantized(self.case, self.invocation, self.seed, self.preset, backend)
            cut = cut_at(gm, self.point.node)
            with torch.no_grad():
                reference = [t.detach().clone() for t in cut(*inputs)]
        except Exception as exc:
            return PieceResult(self.key, Verdict.QUANTIZE_FAIL, error_message=f"cutting the graph failed: "
                               f"{error_text(exc)}")
        with tempfile.TemporaryDirectory(prefix="opdiff-q-") as tmp:
            try:
                with torch.no_grad():
                    artifact = backend.lower_quantized(cut, inputs, self.preset, Path(tmp))
            except Exception as exc:
                return PieceResult(self.key, Verdict.EXPORT_FAIL, error_message=error_text(exc))
            avail = backend.availability(self.preset)
            if not avail.can_run:   # converted: as far as this machine goes
                return PieceResult(self.key, Verdict.UNAVAILABLE, message=f"converted; {avail.reason}")
            try:
                runnable = backend.load(artifact, self.preset, threads=context.threads)
            except Exception as exc:
                return PieceResult(self.key, Verdict.LOAD_FAIL, error_message=error_text(exc))
            try:
                with torch.no_grad():
                    out = runnable([t.clone() for t in inputs])
                outputs = [torch.as_tensor(t).detach().cpu() for t in ([out] if isinstance(out, torch.Tensor)
                                                                     else out)]
            except Exception as exc:
                return PieceResult(self.key, Verdict.INFER_FAIL, error_message=error_text(exc))
        tol = dataclasses.replace(self.tolerance, min_sqnr=None)   # the quantization error is not asked here
        judged = judge_int8(reference, outputs, reference, [self.point.scale], tol, self.preset.precision)
        metrics = {"lowering_steps": judged.lowering_steps, "lowering_bias": judged.lowering_bias,
                   "lowering_sqnr": judged.lowering_sqnr, "quant_step": judged.step}
        return PieceResult(self.key, judged.verdict, metrics, judged.message or "")

    def failed(self, status: Verdict, error_class: str | None, message: str) -> PieceResult:
        return PieceResult(self.key, status, error_message=message)
