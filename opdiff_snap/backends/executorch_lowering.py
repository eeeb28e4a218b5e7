"""ExecuTorch's lowering steps and what a delegate took of a lowered program.

The steps (the device's partitioners, the edge program, the ExecuTorch program, the method
loaded by the runtime, one call of it) are what check runs and, written out as source,
what a repro script runs. `delegation_of` reads the edge program: each op's nodes the
delegate took and those left on the runtime's kernels.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any, Mapping

import torch

from ..core.sources import source_line
from .base import DelegatedOp, Delegation
from .family_common import pieces_of

PROGRAM_FILE = "model.pte"
DELEGATION_FILE = "delegation.json"   # what the delegate took, written beside the program

# The steps below are what check runs, and, written out as source, what a repro script
# runs (ExecuTorchBackend.repro_source): they use only torch, executorch and their arguments.

def executorch_partitioners(device: str, precision: str, options: Mapping[str, Any]) -> list[Any]:
    """The delegate for the device: cpu XNNPACK, portable none, mps MPS, coreml CoreML
    (none at all when the `delegate` option is off)."""
    if device == "portable" or not options.get("delegate", True):
        return []
    if device == "cpu":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        return [XnnpackPartitioner()]
    if device == "mps":
        from executorch.backends.apple.mps.partition import MPSPartitioner
        from executorch.exir.backend.compile_spec_schema import CompileSpec
        use_fp32 = not bool(options.get("export_fp16"))
        return [MPSPartitioner([CompileSpec("use_fp32", bytes([use_fp32]))])]
    if device == "coreml":
        import coremltools as ct
        from executorch.backends.apple.coreml.compiler import CoreMLBackend
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner
        compute = options.get("coreml_compute_precision") or precision
        spec_kwargs: dict[str, Any] = {
            "compute_precision": ct.precision.FLOAT16 if compute == "fp16" else ct.precision.FLOAT32,
            "compute_unit": getattr(ct.ComputeUnit, str(options.get("coreml_compute_units") or "ALL")),
        }
        target = options.get("coreml_minimum_deployment_target")
        if target:
            spec_kwargs["minimum_deployment_target"] = getattr(ct.target, str(target))
        specs = CoreMLBackend.generate_compile_specs(**spec_kwargs)
        return [CoreMLPartitioner(compile_specs=specs,
                                  lower_full_graph=bool(options.get("coreml_lower_full_graph")))]
    raise ValueError(f"unknown ExecuTorch device '{device}'")


def executorch_edge(program: Any, device: str, precision: str, options: Mapping[str, Any]) -> Any:
    """An ExportedProgram in the edge dialect, partitioned to the device's delegate."""
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(program, partitioner=executorch_partitioners(device, precision, options))


def executorch_program(edge: Any, options: Mapping[str, Any]) -> Any:
    """The edge program as an ExecuTorch program."""
    from executorch.exir import ExecutorchBackendConfig

    segments = bool(options.get("extract_delegate_segments", True))
    return edge.to_executorch(config=ExecutorchBackendConfig(extract_delegate_segments=segments))


def executorch_lower(program: Any, device: str, precision: str, options: Mapping[str, Any]) -> Any:
    """An ExportedProgram lowered (to_edge_transform_and_lower with the device's delegate)
    to an ExecuTorch program."""
    return executorch_program(executorch_edge(program, device, precision, options), options)


def executorch_method(path: Path, options: Mapping[str, Any]) -> Any:
    """The program's method loaded by executorch.runtime, with the preset's verification."""
    from executorch.runtime import Runtime, Verification

    level = str(options.get("verification", "minimal"))
    verification = {"minimal": Verification.Minimal,
                    "internal_consistency": Verification.InternalConsistency}.get(level)
    if verification is None:
        raise ValueError(f"verification must be 'minimal' or 'internal_consistency', got {level!r}")
    program = Runtime.get().load_program(path, verification=verification)
    return program.load_method(str(options.get("method_name", "forward")))


def executorch_execute(method: Any, args: list[torch.Tensor]) -> list[torch.Tensor]:
    """One call; outputs may live in the method's planned memory: copied before the next."""
    outs = method.execute(args)
    return [t.clone() if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in outs]


def _op_name(target: Any) -> str:
    """"aten::add.Tensor" for an edge or ATen op overload; its string otherwise."""
    op = getattr(target, "_op", target)
    schema = getattr(op, "_schema", None)
    if schema is None:
        return str(target)
    return f"{schema.name}.{getattr(op, '_overloadname', '') or 'default'}"


def delegation_of(graph_module: Any, shown: int = 5, piece: int | None = None) -> Delegation:
    """The delegated and fallback nodes of an edge program, per op: nodes inside a lowered
    module were taken by its delegate; every other op call stays on the runtime's kernels
    (the fallback), attributed to the model's source line. `piece`: count only the nodes
    of that piece of a batch program (common.Pieces), and the blobs holding any of them."""
    ops: dict[str, DelegatedOp] = {}
    delegates: list[str] = []
    blobs = 0

    def counted(node: Any) -> bool:
        return piece is None or piece in pieces_of(node)

    for node in graph_module.graph.nodes:
        if node.op == "get_attr" and node.name.startswith("lowered_module"):
            lowered = getattr(graph_module, str(node.target))
            inner_ops = [inner for inner in lowered.original_module.graph.nodes
                         if inner.op == "call_function" and inner.target is not operator.getitem and counted(inner)]
            if piece is not None and not inner_ops:
                continue
            blobs += 1
            delegates.append(str(getattr(lowered, "backend_id", "delegate")))
            for inner in inner_ops:
                ops.setdefault(_op_name(inner.target), DelegatedOp(_op_name(inner.target))).delegated += 1
        elif node.op == "call_function" and node.target is not operator.getitem \
                and "executorch_call_delegate" not in str(node.target) and counted(node):
            entry = ops.setdefault(_op_name(node.target), DelegatedOp(_op_name(node.target)))
            entry.fallback += 1
            where = source_line(node.meta.get("stack_trace"))[0]
            if where and where not in entry.sources and len(entry.sources) < shown:
                entry.sources.append(where)
    name = ", ".join(dict.fromkeys(delegates)) or "none"
    return Delegation(name, blobs, sorted(ops.values(), key=lambda o: (-o.fallback, o.op)))


def fallback_text(found: Delegation, shown: int = 6) -> str:
    """The ops a delegate left on the runtime's kernels, quantize and dequantize ops first,
    each with its node count and first source line: "dequantize_per_channel.default x1
    (tiny.py:43), ..."."""
    ops = sorted(found.fallback_ops(), key=lambda o: "quantize" not in o.op)
    text = ", ".join(f"{o.op.split('::')[-1]} x{o.fallback}" + (f" ({o.sources[0]})" if o.sources else "")
                     for o in ops[:shown])
    return text + (f", and {len(ops) - shown} more" if len(ops) > shown else "")
