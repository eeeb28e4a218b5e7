"""One test's ONNX model cut out of a batch's (backends/onnx.py compiles a batch of tests
in one torch.onnx.export): the nodes its outputs need, its inputs renamed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def piece_model(model: Any, inputs: Mapping[str, str], outputs: Sequence[str]) -> Any:
    """The part of `model` that computes `outputs` (graph output names) from the graph
    inputs named in `inputs`, which are renamed to its values; opsets, functions and
    metadata kept. ValueError when those outputs need any other graph input."""
    import onnx
    from onnx import helper

    graph = model.graph
    producer = {name: i for i, node in enumerate(graph.node) for name in node.output}
    needed, keep, todo = set(outputs), set(), list(outputs)
    while todo:
        at = producer.get(todo.pop())
        if at is None or at in keep:
            continue
        keep.add(at)
        for name in _reads(graph.node[at]):
            if name and name not in needed:
                needed.add(name)
                todo.append(name)
    graph_inputs = [v for v in graph.input if v.name in needed]
    foreign = [v.name for v in graph_inputs if v.name not in inputs]
    if foreign:
        raise ValueError(f"the piece's outputs read other pieces' inputs ({', '.join(foreign)})")
    by_name = {o.name: o for o in graph.output}
    cut = helper.make_graph(
        [graph.node[i] for i in sorted(keep)], graph.name, graph_inputs, [by_name[n] for n in outputs],
        initializer=[t for t in graph.initializer if t.name in needed],
        value_info=[v for v in graph.value_info if v.name in needed],
        sparse_initializer=[t for t in graph.sparse_initializer if t.values.name in needed])
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(cut)
    _rename(out.graph, inputs)
    onnx.checker.check_model(out)
    return out


def _reads(node: Any) -> list[str]:
    """Every name a node reads, those its subgraphs (If, Loop, Scan) read from outside included."""
    names = list(node.input)
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in sub.node:
                names.extend(_reads(inner))
    return names


def _rename(graph: Any, names: Mapping[str, str]) -> None:
    for value in [*graph.input, *graph.output]:
        value.name = names.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _rename(sub, names)
