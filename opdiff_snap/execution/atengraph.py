"""One scope of a module test as an ATen graph, with every node's values on the baseline.

`export_scope` (in a worker: it traces user code) exports one submodule call the way the
backends do (backends.family_common.export_program: torch.export, then the default
decompositions to core ATen) and runs the graph eagerly once on the baseline's inputs for
that call, recording every node's inputs and outputs. What it returns, a NodeGraph, is
plain data: op names, argument templates whose tensors refer to other nodes (Ref), the
recorded tensors, and for each node the line of the user's `forward` it came from. It
travels to the parent; a Fragment (one node, or a contiguous range of nodes, with the
recorded values it reads and those it should produce) travels back to a worker and runs
there alone on the target (cause/alone.py's FragmentTask).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..core.errors import OpdiffError
from ..core.sources import source_line
from ..suite.construct import resolve_op
from .outputs import flat_values


@dataclass(frozen=True)
class Ref:
    """An argument that is the value of a graph input or of another node; `item` picks one
    output of a node that returns several."""

    name: str
    item: int | None = None

    def __str__(self) -> str:
        return self.name if self.item is None else f"{self.name}[{self.item}]"


@dataclass
class GraphNode:
    """One ATen op call of the graph. `args`/`kwargs` are templates: constants, with Refs
    where tensors go. `items`: for an op returning several values, the ones the graph uses."""

    index: int                 # execution order among the graph's op calls
    name: str                  # the FX node's name
    op: str                    # "aten::addmm"
    overload: str              # "default"
    args: Any            # the call's positional arguments (a list or tuple template)
    kwargs: dict[str, Any]
    items: tuple[int, ...] | None = None
    source: str = ""           # "mods.py:13 in forward: return self.fc2(torch.tanh(self.fc1(x)))"
    source_path: str = ""      # "/abs/path/mods.py:13"
    module: str = ""           # the submodule it ran in, relative to the scope: "fc1 (Linear)"
    constant: bool = False     # computed from weights and constants only (backends fold it at export)

    @property
    def target(self) -> str:
        return f"{self.op}.{self.overload}"

    def produces(self) -> list[Ref]:
        if self.items is None:
            return [Ref(self.name)]
        return [Ref(self.name, i) for i in self.items]


@dataclass
class NodeGraph:
    """A scope's ATen graph and every value in it on the baseline."""

    scope: str                                  # "" for the whole module; "name" or "name#k"
    nodes: list[GraphNode] = field(default_factory=list)
    outputs: list[Ref] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)   # placeholder / node name -> baseline value
    constants: set[str] = field(default_factory=set)       # weights, constants, and nodes computed from them only
    graph_vs_eager: float | None = None         # max |graph output - the scope's eager output|
    error: str | None = None                    # why there is no graph
    _last_use: dict[Ref, int] | None = field(default=None, repr=False, compare=False)

    def last_use(self) -> dict[Ref, int]:
        """The index of the last node reading each value (past the last node: a graph output),
        computed once: a scan asks it of every node."""
        if self._last_use is None:
            last = {r: i for i, n in enumerate(self.nodes) for r in refs_in((n.args, n.kwargs))}
            last.update({r: len(self.nodes) for r in self.outputs})
            self._last_use = last
        return self._last_use

    def value(self, ref: Ref) -> Any:
        v = self.values[ref.name]
        return v if ref.item is None else v[ref.item]

    def fragment(self, start: int, stop: int, outputs: list[Ref] | None = None,
                 folded: bool = True) -> "Fragment":
        """Nodes start..stop (inclusive) with the values they read from outside the range;
        they should produce `outputs`, by default every value of theirs that a later node
        or the graph's output uses. Nodes computed from weights and constants only are not
        run but read, like weights: backends fold them at export, in the precision they
        compute in (a node that fixes its dtype, as decompositions do, stays consistent).
        `folded=False` keeps them: a backend must still convert them (op_survey.py)."""
        nodes = [n for n in self.nodes[start:stop + 1] if not (folded and n.constant)]
        if not nodes:
            raise ValueError(f"nodes {start}-{stop} are computed from weights and constants only")
        inside = {n.name for n in nodes}
        inputs: list[Ref] = []
        for n in nodes:
            for r in refs_in((n.args, n.kwargs)):
                if r.name not in inside and r not in inputs:
                    inputs.append(r)
        if outputs is None:
            last = self.last_use()
            outputs = [r for n in nodes for r in n.produces() if last.get(r, -1) > stop] or nodes[-1].produces()
        return Fragment(start, stop, nodes, inputs, [self.value(r) for r in inputs],
                        [r.name in self.constants for r in inputs], list(outputs),
                        flat_values([self.value(r) for r in outputs]))


def refs_in(template: Any) -> list[Ref]:
    out: list[Ref] = []

    def walk(x: Any) -> None:
        if isinstance(x, Ref):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)

    walk(template)
    return out


def fill(template: Any, lookup: Callable[[Ref], Any]) -> Any:
    """The template with every Ref replaced by lookup(ref)."""
    if isinstance(template, Ref):
        return lookup(template)
    if isinstance(template, list):
        return [fill(v, lookup) for v in template]
    if isinstance(template, tuple):
        return tuple(fill(v, lookup) for v in template)
    if isinstance(template, dict):
        return {k: fill(v, lookup) for k, v in template.items()}
    return template


_SHORT_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
                 torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
                 torch.uint8: "u8", torch.bool: "bool", torch.complex64: "c64", torch.complex128: "c128"}


def describe(value: Any) -> str:
    """A value as the reports show it: f32[4, 16] for a tensor, the constant otherwise."""
    if isinstance(value, torch.Tensor):
        return f"{_SHORT_DTYPES.get(value.dtype, str(value.dtype).removeprefix('torch.'))}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return repr(value)


def signature(nodes: list[GraphNode], lookup: Callable[[Ref], Any]) -> tuple[str, str]:
    """("f32[4, 8], [1, 0]", "f32[8, 4]"): what a node (a range: its first node) reads,
    constants included, and what the node (the range's last) produces."""
    first, last = nodes[0], nodes[-1]
    args = [describe(a) for a in fill(list(first.args), lookup)]
    args += [f"{k}={describe(v)}" for k, v in fill(dict(first.kwargs), lookup).items()]
    outs = ", ".join(describe(lookup(r)) for r in last.produces())
    return ", ".join(args), outs


def module_label(meta: dict[str, Any]) -> str:
    stack = meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    path = re.sub(r"^(side_a\.?)+", "", str(path))
    cls = str(getattr(cls, "__name__", cls)).rsplit(".", 1)[-1]
    return f"{path} ({cls})" if path else ""


# ---------------------------------------------------------------- export and record

def _template(x: Any, alias: dict[str, Ref]) -> Any:
    if isinstance(x, torch.fx.Node):
        return alias.get(x.name, Ref(x.name))
    if isinstance(x, (list, tuple)):   # immutable_list and friends become plain containers
        items = [_template(v, alias) for v in x]
        return items if isinstance(x, list) else tuple(items)
    if isinstance(x, dict):
        return {k: _template(v, alias) for k, v in x.items()}
    return x


def _detached(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detached(v) for v in x) if type(x) in (list, tuple) else [_detached(v) for v in x]
    return x


def export_scope(module: torch.nn.Module, args: list[Any], kwargs: dict[str, Any], where: str,
                 scope: str = "", strict: bool = False, core: bool = True) -> NodeGraph:
    """Export `module(*args, **kwargs)` to core ATen (`core=False`: to ATen with no
    decomposition, the ops as the model's code calls them) and record every node on these
    inputs."""
    from ..backends.family_common import export_program
    from .prepare import prepare_call

    prepared = prepare_call({"a": module}, list(args), dict(kwargs), where)
    try:
        program = export_program(prepared.module, prepared.inputs,
                                 {"use_default_decompositions": core, "export_strict": strict}, True)
    except Exception as exc:
        from ..core.errors import error_text
        raise OpdiffError(f"{where} cannot be exported to an ATen graph on the baseline "
                          f"({error_text(exc)}); localize can name the submodule, not the op.") from None
    gm = program.graph_module
    sig = program.graph_signature
    user_inputs = iter(prepared.fresh_inputs())
    feed: list[Any] = []
    graph = NodeGraph(scope)
    for spec in sig.input_specs:
        name, kind, target = spec.arg.name, spec.kind.name, spec.target
        if kind == "USER_INPUT":
            value = next(user_inputs)
        elif kind in ("PARAMETER", "BUFFER"):
            graph.constants.add(name)
            value = program.state_dict[target] if target in program.state_dict else program.constants[target]
        elif kind == "CONSTANT_TENSOR":
            graph.constants.add(name)
            value = program.constants[target]
        else:
            raise OpdiffError(f"{where}: its exported graph takes a {kind.lower()} input ('{name}'), which "
                              "localize cannot feed.")
        feed.append(value.detach() if isinstance(value, torch.Tensor) else value)

    interp = torch.fx.Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        out = interp.run(*feed)
    env = {n.name: _detached(v) for n, v in interp.env.items()}

    alias: dict[str, Ref] = {}
    items: dict[str, list[int]] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            graph.values[node.name] = env[node.name]
        elif node.op == "call_function" and node.target is operator.getitem:
            src, idx = node.args
            alias[node.name] = Ref(src.name, int(idx))
            items.setdefault(src.name, []).append(int(idx))
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            source, path = source_line(node.meta.get("stack_trace"))
            args, kwargs = _template(tuple(node.args), alias), _template(dict(node.kwargs), alias)
            constant = all(r.name in graph.constants for r in refs_in((args, kwargs)))
            graph.nodes.append(GraphNode(
                len(graph.nodes), node.name, node.target._schema.name, node.target._overloadname, args, kwargs,
                source=source, source_path=path, module=module_label(node.meta), constant=constant))
            if constant:
                graph.constants.add(node.name)
            graph.values[node.name] = env[node.name]
        elif node.op == "output":
            graph.outputs = [r for r in refs_in(_template(node.args[0], alias))]
        elif node.op == "call_function":
            raise OpdiffError(f"{where}: node '{node.name}' of its ATen graph calls {node.target}, which is not "
                              "an ATen operator; localize cannot run it alone.")
        else:
            raise OpdiffError(f"{where}: its ATen graph has a '{node.op}' node ('{node.name}'); localize "
                              "handles graphs of operator calls only.")
    for n in graph.nodes:
        value = graph.values[n.name]
        if isinstance(value, (list, tuple)):
            used = sorted(set(items.get(n.name, [])))
            n.items = tuple(used) if used else tuple(range(len(value)))
    with torch.no_grad():
        eager = flat_values(prepared.module(*prepared.fresh_inputs()))
    got = flat_values(out)
    diffs = [float((g.double() - e.double()).abs().max()) for g, e in zip(got, eager)
             if g.shape == e.shape and g.is_floating_point() and g.numel()]
    graph.graph_vs_eager = max(diffs, default=0.0)
    return graph


# ---------------------------------------------------------------- fragments

@dataclass
class Fragment:
    """Nodes start..stop of a graph, the recorded values they read from outside, and the
    recorded values of what they should produce. Plain data: it pickles without user code.

    What they read from weights and constants (`constant_inputs`) is held inside the module
    as buffers, as in the model, where backends treat it as static (prepacked weights,
    constant folding); only the other values are inputs."""

    start: int
    stop: int
    nodes: list[GraphNode]
    inputs: list[Ref]
    input_values: list[Any]
    constant_inputs: list[bool]
    outputs: list[Ref]
    expected: list[torch.Tensor]

    @property
    def label(self) -> str:
        return f"node {self.start}" if self.start == self.stop else f"nodes {self.start}-{self.stop}"

    @property
    def activations(self) -> list[Any]:
        """The values that are inputs of the module (the rest are its buffers)."""
        return [v for v, c in zip(self.input_values, self.constant_inputs) if not c]

    def buffer_names(self) -> dict[Ref, str]:
        """The buffer name of each constant input: c0, c1, ... (the module and repro scripts
        hold them so)."""
        consts = [r for r, c in zip(self.inputs, self.constant_inputs) if c]
        return {r: f"c{k}" for k, r in enumerate(consts)}

    def buffers(self) -> dict[str, Any]:
        """The constant inputs by their buffer names."""
        names = self.buffer_names()
        return {names[r]: v for r, v in zip(self.inputs, self.input_values) if r in names}

    def single_op(self) -> bool:
        """One node whose whole output is wanted and that reads no weight: the bare OpOverload."""
        return (len(self.nodes) == 1 and self.outputs == [Ref(self.nodes[0].name)]
                and not any(self.constant_inputs))

    def call(self) -> tuple[Callable[..., Any], list[Any], dict[str, Any]]:
        """(callable, args, kwargs) with the recorded values in place."""
        if self.single_op():
            node = self.nodes[0]
            known = dict(zip(self.inputs, self.input_values))
            return (resolve_op(f"{node.op}.{node.overload}"), list(fill(node.args, known.__getitem__)),
                    dict(fill(node.kwargs, known.__getitem__)))
        return self.module(), list(self.activations), {}

    def module(self) -> torch.fx.GraphModule:
        """The range as a module: constant inputs as buffers c0, c1, ..., one input per other
        outside value, a tuple of its outputs."""
        root = torch.nn.Module()
        for name, value in self.buffers().items():
            root.register_buffer(name, value.clone() if isinstance(value, torch.Tensor) else torch.tensor(value))
        g = torch.fx.Graph()
        env: dict[Ref, torch.fx.Node] = {}
        for r, constant in zip(self.inputs, self.constant_inputs):
            if not constant:
                env[r] = g.placeholder(re.sub(r"\W", "_", f"{r.name}_{r.item}" if r.item is not None else r.name))
        for r, name in self.buffer_names().items():
            env[r] = g.get_attr(name)

        def lookup(r: Ref) -> torch.fx.Node:
            if r not in env:   # one output of a multi-output node of the range
                env[r] = g.call_function(operator.getitem, (env[Ref(r.name)], r.item))
            return env[r]

        for node in self.nodes:
            env[Ref(node.name)] = g.create_node("call_function", resolve_op(f"{node.op}.{node.overload}"),
                                                fill(node.args, lookup), fill(node.kwargs, lookup),
                                                name=node.name)
        g.output(tuple(lookup(r) for r in self.outputs))
        return torch.fx.GraphModule(root, g)
