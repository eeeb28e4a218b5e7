"""Every ATen op of a test that a backend cannot lower, at once, and where each comes from.

Converters stop at the first op they cannot take. Here the test's module is exported once
with torch.export to ATen without decompositions (the ops as the model's code calls them;
this succeeds for models a backend rejects), its graph runs on the test's inputs to record
every value (atengraph.py), and each distinct (op, input signature) is lowered alone on
the target (op_support.py: the backend's own export, and load where the preset runs
here). The ops that fail alone are the list (op_support.Survey), each with how many nodes
make it, the source lines of the model's code they come from and the module they run in.

Answers are cached (op_support.OpSupportCache). The same survey serves check (in the
worker whose job failed to lower), localize (its probes spread over the pool) and
`opdiff ops` (every test of the suites, where a graph that lowers whole answers for all
its ops at once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import torch

from ..backends.base import Backend, Preset
from ..core.errors import OpdiffError, error_text
from ..core.verdicts import Verdict
from ..suite.model import Invocation, TestCase
from .atengraph import Fragment, GraphNode, NodeGraph, Ref, describe, export_scope
from .job import WorkerContext
from .op_support import OpSupportCache, OpVerdict, Survey, UnsupportedOp, answer, lower_alone, lowers

if TYPE_CHECKING:
    from .prepare import Prepared

# How many distinct signatures, sources and modules one unsupported op lists.
SHOWN = 5


@dataclass
class OpCall:
    """One distinct (op, input signature) of a graph: its first node as a one-node
    fragment (what it reads from weights and constants held as buffers, as backends see
    them in the model), and every node that makes the same call. Plain data: it travels
    to workers."""

    op: str                       # "aten::diff.default"
    signature: str                # "f32[1, 8], const f32[32], 1e-05": "const" marks weights and constants
    fragment: Fragment
    nodes: list[GraphNode] = field(default_factory=list)


def call_signature(graph: NodeGraph, node: GraphNode) -> str:
    """What a node reads, as cache keys and reports name it: activations by dtype and
    shape, weights and constants the same with "const" before them, other arguments as
    values."""
    def one(x: Any) -> str:
        if isinstance(x, Ref):
            text = describe(graph.value(x))
            return f"const {text}" if x.name in graph.constants else text
        if isinstance(x, (list, tuple)) and any(isinstance(v, Ref) for v in x):
            inner = ", ".join(one(v) for v in x)
            return f"[{inner}]"
        return describe(x)

    parts = [one(a) for a in node.args] + [f"{k}={one(v)}" for k, v in node.kwargs.items()]
    return ", ".join(parts)


def distinct_calls(graph: NodeGraph) -> list[OpCall]:
    """The graph's op calls that produce a value, one per (op, signature), in order of
    first appearance."""
    calls: dict[tuple[str, str], OpCall] = {}
    for n in graph.nodes:
        if graph.values.get(n.name) is None:   # returns nothing (a shape assertion): nothing to lower
            continue
        sig = call_signature(graph, n)
        key = (n.target, sig)
        if key not in calls:
            calls[key] = OpCall(n.target, sig, graph.fragment(n.index, n.index, n.produces(), folded=False))
        calls[key].nodes.append(n)
    return list(calls.values())


@dataclass
class ProbeTask:
    """Lower one OpCall alone on the target, in a worker (see execution.job.Task)."""

    key: str
    preset: Preset
    call: OpCall
    backend: Backend | None = None   # None: the registry's backend for the preset

    def run(self, context: WorkerContext = WorkerContext()) -> OpVerdict:
        from ..backends.registry import backend_for

        backend = self.backend if self.backend is not None else backend_for(self.preset)
        fn, args, kwargs = self.call.fragment.call()
        return lower_alone(backend, self.preset, self.call.op, fn, args, kwargs, self.call.signature,
                           context.threads)

    def failed(self, status: Verdict, error_class: str | None, message: str) -> OpVerdict:
        return OpVerdict(self.preset.name, self.call.op, self.call.signature, False, status.value, message)


Ask = Callable[[list[ProbeTask]], Iterable[OpVerdict]]


def answers_for(calls: Sequence[OpCall], preset: Preset, ask: Ask, cache: OpSupportCache | None,
                backend: Backend | None = None, whole: Callable[[], bool] | None = None
                ) -> tuple[dict[tuple[str, str], OpVerdict], int]:
    """Each call's answer, and how many were lowered alone now: from the cache, else, when
    `whole` (the whole graph lowered at once) says yes, yes for all; else lowered alone by
    `ask`. Every new answer but a crash's or a timeout's is cached."""
    answers: dict[tuple[str, str], OpVerdict] = {}
    todo: list[ProbeTask] = []
    for i, c in enumerate(calls):
        hit = cache.get(preset, c.op, c.signature) if cache is not None else None
        if hit is not None:
            answers[(c.op, c.signature)] = hit
        else:
            todo.append(ProbeTask(str(i), preset, c, backend))
    if todo and whole is not None and whole():
        found: Iterable[OpVerdict] = [answer(preset, t.call.op, t.call.signature, None) for t in todo]
        asked = 0
    else:
        found, asked = (ask(todo) if todo else ()), len(todo)
    for v in found:
        answers[(v.op, v.signature)] = v
        # a probe that crashed or hung its worker says nothing lasting: ask again next time
        if cache is not None and v.stage not in (Verdict.CRASH.value, Verdict.TIMEOUT.value):
            cache.put(preset, v)
    return answers, asked


def unsupported(calls: Sequence[OpCall], answers: dict[tuple[str, str], OpVerdict]) -> list[UnsupportedOp]:
    """The ops whose calls fail alone, one entry per op, in order of first appearance."""
    out: dict[str, UnsupportedOp] = {}
    for c in calls:
        a = answers.get((c.op, c.signature))
        if a is None or a.lowers:
            continue
        u = out.get(c.op)
        if u is None:
            u = out[c.op] = UnsupportedOp(c.op, 0, a.stage or Verdict.EXPORT_FAIL.value, a.error)
        u.count += len(c.nodes)
        _add(u.signatures, [c.signature])
        _add(u.sources, [n.source for n in c.nodes])
        _add(u.source_paths, [n.source_path for n in c.nodes])
        _add(u.modules, [n.module for n in c.nodes])
    return list(out.values())


def _add(into: list[str], values: Iterable[str]) -> None:
    for v in values:
        if v and v not in into and len(into) < SHOWN:
            into.append(v)


NONE_ALONE = ("every ATen op of its graph lowers alone: the backend fails on the graph as a whole "
              "(how ops combine, or its own export path), not on one op")


def survey_graph(graph: NodeGraph, preset: Preset, ask: Ask, cache: OpSupportCache | None,
                 backend: Backend | None = None) -> Survey:
    t0 = time.perf_counter()
    calls = distinct_calls(graph)
    answers, _ = answers_for(calls, preset, ask, cache, backend)
    found = unsupported(calls, answers)
    return Survey(preset.name, found, len(calls), sum(not a.cached for a in answers.values()),
                  time.perf_counter() - t0, "" if found else NONE_ALONE)


def module_graph(module: torch.nn.Module, inputs: Sequence[Any], where: str) -> NodeGraph:
    """The ATen graph (undecomposed) of a flat module on its inputs, every value recorded."""
    return export_scope(module, list(inputs), {}, where, core=False)


@dataclass
class TestGraph:
    """A test as its flat module, that module's ATen graph and the graph's distinct op
    calls, with the op-support cache and a way to ask about calls in this worker: what
    surveying a test and `opdiff ops` start from."""

    prepared: Prepared
    graph: NodeGraph
    calls: list[OpCall]
    cache: OpSupportCache | None
    threads: int = 0

    @classmethod
    def of(cls, case: TestCase, invocation: Invocation, cache_dir: Any, threads: int = 0) -> TestGraph:
        """Raises what preparing the test or recording its graph raised."""
        from .prepare import flat_module

        prepared = flat_module(case, invocation)
        graph = module_graph(prepared.module, prepared.fresh_inputs(), f"test '{case.id}'")
        return cls(prepared, graph, distinct_calls(graph),
                   OpSupportCache(cache_dir) if cache_dir is not None else None, threads)

    def ask(self, tasks: list[ProbeTask]) -> list[OpVerdict]:
        """Lower each call alone, here, one after another."""
        return [t.run(WorkerContext(threads=self.threads)) for t in tasks]

    def lowers_whole(self, backend: Backend, preset: Preset, can_run: bool) -> bool:
        """Whether the test's flat module exports (and, with `can_run`, loads) on `preset`."""
        return lowers(backend, preset, self.prepared, can_run, self.threads)[0] is None


def survey_test(case: TestCase, invocation: Invocation, preset: Preset, cache_dir: Any,
                backend: Backend | None = None, threads: int = 0) -> Survey:
    """In a worker: every op of the test's graph that `preset` cannot lower, lowered here
    one after another (check runs it where the test's own job failed to lower)."""
    t0 = time.perf_counter()
    try:
        test = TestGraph.of(case, invocation, cache_dir, threads)
    except OpdiffError as exc:
        return Survey(preset.name, seconds=time.perf_counter() - t0, note=str(exc))
    except Exception as exc:
        return Survey(preset.name, seconds=time.perf_counter() - t0,
                      note=f"its ATen graph could not be recorded: {error_text(exc)}")
    found = survey_graph(test.graph, preset, test.ask, test.cache, backend)
    found.seconds = time.perf_counter() - t0
    return found
