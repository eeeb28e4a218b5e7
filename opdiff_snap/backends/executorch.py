"""ExecuTorch: torch.export -> edge dialect -> (delegate) -> .pte, run by executorch.runtime.

Devices pick the delegate: cpu = XNNPACK partitioner, portable = no delegate (portable
kernels), mps = MPS partitioner, coreml = CoreML partitioner. ExecuTorch is imported only
inside export/load: its first XNNPACK lowering costs seconds of imports.

Precision follows opdiff: fp16 on cpu/portable/mps casts the module and floating inputs to
float16 before export (`export_fp16`); coreml_fp16 exports float32 and asks the CoreML
delegate for FLOAT16 compute precision (`coreml_compute_precision`).

int8 (cpu only: XNNPACK's quantizer): the float32 module is quantized through PT2E with
ExecuTorch's XNNPACKQuantizer (symmetric; weights per channel for int8 and int8dyn, per
tensor for int8pt; activations from calibration, or dynamic for int8dyn), then lowered
like any program. The converted model, run in torch before lowering, is the quantized
reference its results are judged against.
"""

from __future__ import annotations

import json
import operator
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..core.limits import THREADS
from ..core.sources import source_line
from .base import (
    APPLE_SILICON,
    MACOS,
    QUANTIZED,
    Artifact,
    Availability,
    Backend,
    DelegatedOp,
    Delegation,
    Dynamic,
    Piece,
    PiecesFailed,
    Preset,
    Quantized,
    Runnable,
)
from .common import (
    INT8_OPTIONS,
    INT8_RANGES,
    IS_MACOS,
    Pieces,
    cast_inputs,
    contiguous_cpu,
    export_program,
    has_module,
    int8_on_cpu,
    pieces_at_fault,
    pieces_of,
    pt2e_quantize,
    script_source,
    single_file,
    thread_budget,
    xnnpack_quantizer,
)

PROGRAM_FILE = "model.pte"
DELEGATION_FILE = "delegation.json"   # what the delegate took, written beside the program
DELEGATION_MAX_BYTES = 4 << 20
# a test compiled in a batch program: where it sits among the program's inputs and outputs,
# and the batch's example inputs, which fill the other tests' places when it runs
PIECE_FILE = "piece.json"
BATCH_INPUTS_FILE = "batch_inputs.pt"
BATCH_DEVICES = ("cpu", "portable")   # the devices whose batch programs run here to be proven

_PARTITIONER_MODULES = {
    "cpu": "executorch.backends.xnnpack.partition.xnnpack_partitioner",
    "mps": "executorch.backends.apple.mps.partition",
    "coreml": "executorch.backends.apple.coreml.partition",
}


class ExecuTorchBackend(Backend):
    """`executorch_<cpu|portable|mps|coreml>_<fp32|fp16>`, and `executorch_cpu_<int8|int8pt|int8dyn>`."""

    family = "executorch"
    devices = ("cpu", "portable", "mps", "coreml")
    precisions = ("fp32", "fp16", "int8", "int8pt", "int8dyn")
    default_options: Mapping[str, Any] = {
        "export_fp16": False,                 # cast module + float inputs to float16 before export
        "export_strict": False,               # torch.export.export(strict=...)
        "use_default_decompositions": False,  # run_decompositions() before lowering (else lowering decides)
        "method_name": "forward",
        "verification": "minimal",            # program verification at load: minimal | internal_consistency
        "extract_delegate_segments": True,
        "num_threads": None,                  # XNNPACK threadpool size; None: the job's thread budget
        "coreml_compute_precision": None,     # coreml device: fp32 | fp16 (from the preset)
        "coreml_compute_units": "ALL",        # coreml device: CPU_ONLY | CPU_AND_GPU | CPU_AND_NE | ALL
        "coreml_minimum_deployment_target": None,  # coreml device: e.g. iOS18; None: delegate default
        "coreml_lower_full_graph": False,
        "require_delegated": False,           # check: an op node left off the delegate is NOT_DELEGATED
        "delegate": True,                     # False: no partitioner (every op on the runtime's kernels)
        "batch_program": False,               # compile a check's tests in one program per batch (no infer_ms)
        **INT8_OPTIONS,                       # the int8 presets'
    }
    option_ranges = {"num_threads": THREADS, **INT8_RANGES}
    serializes = True
    can_differentiate = False
    repro_needs = "torch, executorch"
    repro_source = ""  # set below the class, from the functions export and load call

    def preset_options(self, device: str, precision: str) -> dict[str, Any]:
        if precision in QUANTIZED:   # dynamic activations: the zoo's transformers reach 7 steps (measured)
            return {"export_fp16": False, **({"steps": 8.0} if precision == "int8dyn" else {})}
        if device == "coreml":
            return {"coreml_compute_precision": precision}
        return {"export_fp16": precision == "fp16"}

    def offers(self, device: str, precision: str) -> bool:
        return int8_on_cpu(device, precision)

    def quantize(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                 calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset) -> tuple[torch.nn.Module, Quantized]:
        scheme = preset.scheme
        assert scheme is not None
        return pt2e_quantize(module, inputs, calibration, xnnpack_quantizer(scheme.per_channel, scheme.dynamic),
                             preset.options)

    def lower_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], preset: Preset,
                        workdir: Path) -> Artifact:
        return self.export(module, inputs, preset, workdir)

    def requires(self, preset: Preset) -> frozenset[str]:
        return {"mps": frozenset({MACOS, APPLE_SILICON}), "coreml": frozenset({MACOS})}.get(preset.device, frozenset())

    def availability(self, preset: Preset) -> Availability:
        if not has_module("executorch.exir"):
            return Availability(False, False, "ExecuTorch is not installed (pip install 'opdiff-snap[executorch]')")
        device = preset.device
        part = _PARTITIONER_MODULES.get(device)
        if part is not None and not has_module(part):
            why = {"mps": "this ExecuTorch build has no MPS backend (it ships in macOS builds)",
                   "coreml": "this ExecuTorch build has no CoreML backend"}.get(
                device, "this ExecuTorch build has no XNNPACK backend")
            return Availability(False, False, why)
        if preset.scheme is not None and not has_module("torchao.quantization.pt2e"):
            return Availability(False, False, "the int8 presets quantize with torchao's PT2E, which is not installed")
        if device == "coreml" and not has_module("coremltools"):
            return Availability(False, False, "the ExecuTorch CoreML delegate needs coremltools")
        if device in ("mps", "coreml") and not IS_MACOS:
            return Availability(True, False, f"the ExecuTorch {device.upper() if device == 'mps' else 'CoreML'} "
                                             "delegate runs only on macOS (lowering is checked here)")
        return Availability(True, True)

    def export(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
               preset: Preset, workdir: Path) -> Artifact:
        return self.export_dynamic(module, inputs, (), preset, workdir)

    def export_dynamic(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dims: Dynamic,
                       preset: Preset, workdir: Path) -> Artifact:
        """With dims, the program's inputs are bounded by each dim's largest size (ExecuTorch
        plans memory for the upper bound)."""
        opts = preset.options
        program = export_program(module, inputs, opts, always_decompose=False, dynamic=dims or None)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        edge = executorch_edge(program, preset.device, preset.precision, opts)
        found = None
        if preset.device != "portable":
            found = delegation_of(edge.exported_program().graph_module)
            (workdir / DELEGATION_FILE).write_text(json.dumps(found.to_json()))
        try:
            lowered = executorch_program(edge, opts)
        except Exception as exc:
            if preset.scheme is not None and found is not None and found.fallback:
                raise RuntimeError(f"{exc}; the quantized program keeps ops off the "
                                   f"{found.delegate} delegate, which need kernels of their own: "
                                   + fallback_text(found)) from exc
            raise
        with open(workdir / PROGRAM_FILE, "wb") as f:
            lowered.write_to_file(f)
        return Artifact(path=workdir)

    def batches(self, preset: Preset) -> bool:
        """Only when asked (`batch_program`): one program runs its whole batch in one call,
        so its results say nothing of each test's latency."""
        return (bool(preset.options.get("batch_program")) and preset.device in BATCH_DEVICES
                and preset.scheme is None)

    def batch_timed_alone(self, preset: Preset) -> bool:
        return False

    def export_batch(self, pieces: Sequence[Piece], preset: Preset, workdir: Path) -> list[Artifact | None]:
        """One program whose single forward runs every piece on its own inputs. Each piece
        gets a folder holding the program (a hard link where the disk allows), where it
        sits in the program's inputs and outputs (piece.json), the batch's example inputs,
        and the delegation of its own nodes."""
        opts = preset.options
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        arity = [len(p.inputs) for p in pieces]
        inputs = [t for p in pieces for t in p.inputs]
        try:
            program = export_program(Pieces([p.module for p in pieces], arity), inputs, opts, always_decompose=False)
            edge = executorch_edge(program, preset.device, preset.precision, opts)
            returned = len(edge.exported_program().graph_signature.user_outputs)
            # of the edge program as lowered: to_executorch rewrites its graph in place
            delegations = [delegation_of(edge.exported_program().graph_module, piece=i).to_json()
                           if preset.device != "portable" else None for i in range(len(pieces))]
            lowered = executorch_program(edge, opts)
        except Exception as exc:
            at_fault = pieces_at_fault(exc)
            if at_fault:
                raise PiecesFailed(at_fault) from exc
            raise
        if returned != sum(p.outputs for p in pieces):
            raise RuntimeError(f"the batch program returns {returned} outputs; its pieces return "
                               f"{sum(p.outputs for p in pieces)}")
        can_run = self.availability(preset).can_run
        missing = _without_kernels(lowered.exported_program().graph_module) if can_run else []
        if missing:
            raise PiecesFailed(missing, "the runtime has no kernel for an op of these pieces")
        shared = workdir / PROGRAM_FILE
        with open(shared, "wb") as f:
            lowered.write_to_file(f)
        examples = workdir / BATCH_INPUTS_FILE
        torch.save([t.detach().contiguous().cpu() for t in inputs], examples)
        if can_run:
            # one piece whose kernel rejects its arguments would fail the whole program for
            # every test in it: found here, the batch is split instead
            dtype = torch.float16 if opts.get("export_fp16") else None
            executorch_execute(executorch_method(shared, opts), contiguous_cpu(cast_inputs(inputs, dtype)))
        artifacts: list[Artifact | None] = []
        first_in = first_out = 0
        for i, piece in enumerate(pieces):
            folder = workdir / f"piece{i}"
            folder.mkdir()
            _link(shared, folder / PROGRAM_FILE)
            _link(examples, folder / BATCH_INPUTS_FILE)
            (folder / PIECE_FILE).write_text(json.dumps(
                {"inputs": [first_in, arity[i]], "outputs": [first_out, piece.outputs], "batch": len(pieces)}))
            if delegations[i] is not None:
                (folder / DELEGATION_FILE).write_text(json.dumps(delegations[i]))
            artifacts.append(Artifact(path=folder))
            first_in += arity[i]
            first_out += piece.outputs
        shared.unlink()
        examples.unlink()
        return artifacts

    def delegates(self, preset: Preset) -> bool:
        return preset.device != "portable"

    def delegation(self, artifact: Artifact, preset: Preset) -> Delegation | None:
        """What export found of the delegate's share (kept beside the program, so a cached
        artifact says it too); None for the portable device, which delegates nothing.
        Evidence that is missing or not what export wrote raises ValueError."""
        if not self.delegates(preset):
            return None
        if artifact.path is None:
            raise ValueError("the artifact has no folder to hold its delegation evidence")
        path = Path(artifact.path) / DELEGATION_FILE
        try:
            if path.stat().st_size > DELEGATION_MAX_BYTES:
                raise ValueError(f"{DELEGATION_FILE} holds more than {DELEGATION_MAX_BYTES} bytes")
            return Delegation.from_json(json.loads(path.read_text()))
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{DELEGATION_FILE} cannot be read ({exc.__class__.__name__})") from None

    def prepare_runtime(self, preset: Preset) -> None:
        from executorch.runtime import Runtime

        Runtime.get()

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        avail = self.availability(preset)
        if not avail.can_run:
            raise RuntimeError(avail.reason)
        opts = preset.options
        _set_threads(thread_budget(opts.get("num_threads"), threads))
        assert artifact.path is not None
        method = executorch_method(single_file(Path(artifact.path), ".pte"), opts)
        dtype = torch.float16 if opts.get("export_fp16") else None
        place = _batch_place(Path(artifact.path))

        def run(inputs):
            if place is None:
                return executorch_execute(method, contiguous_cpu(cast_inputs(inputs, dtype)))
            (first_in, n_in), (first_out, n_out), examples = place
            args = list(examples)
            args[first_in:first_in + n_in] = inputs
            return executorch_execute(method, contiguous_cpu(cast_inputs(args, dtype)))[first_out:first_out + n_out]

        return run

# The steps below are what check runs, and, written out as source, what a repro script
# runs (`repro_source`): they use only torch, executorch and their arguments.

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


_REPRO_GLUE = '''

OPTIONS = PRESET["options"]


def export(module, inputs):
    """torch.export (float16 when the preset exports fp16), lowered and written to a .pte file."""
    if OPTIONS.get("export_fp16"):
        module = module.half()
        inputs = [x.half() if x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        program = torch.export.export(module, tuple(x.contiguous() for x in inputs),
                                      strict=bool(OPTIONS.get("export_strict")))
        if OPTIONS.get("use_default_decompositions"):
            program = program.run_decompositions()
    path = Path(tempfile.mkdtemp()) / "model.pte"
    with open(path, "wb") as f:
        executorch_lower(program, PRESET["device"], PRESET["precision"], OPTIONS).write_to_file(f)
    return path


def load(path):
    method = executorch_method(path, OPTIONS)

    def run(inputs):
        if OPTIONS.get("export_fp16"):
            inputs = [x.half() if x.is_floating_point() else x for x in inputs]
        return executorch_execute(method, [x.contiguous() for x in inputs])

    return run
'''

# What a standalone repro script runs for this family (cause/repro.py writes it out): the
# functions check runs, as source, and the glue that calls them the way export and load do.
ExecuTorchBackend.repro_source = script_source(
    ["import tempfile", "from typing import Any, Mapping"], {},
    [executorch_partitioners, executorch_edge, executorch_program, executorch_lower, executorch_method,
     executorch_execute], _REPRO_GLUE)


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


def _without_kernels(graph_module: Any) -> list[int]:
    """The pieces of a batch program (after to_executorch) calling an op the runtime here
    has no kernel for: loading the program would fail for every test in it."""
    try:
        from executorch.extension.pybindings import portable_lib
        registered = set(portable_lib._get_operator_names())
    except (ImportError, AttributeError):
        return []
    found: set[int] = set()
    for node in graph_module.graph.nodes:
        schema = getattr(node.target, "_schema", None) or getattr(getattr(node.target, "_op", None), "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        if name not in registered and schema.name not in registered:
            found |= pieces_of(node)
    return sorted(found)


def _link(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` (one copy of a batch's program on disk), or a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _batch_place(folder: Path) -> tuple[tuple[int, int], tuple[int, int], list[torch.Tensor]] | None:
    """Where a batch-compiled test sits in its program ((first input, count), (first output,
    count)) and the batch's example inputs; None for a program of its own. Raises
    ValueError when the folder's account of it is not what export_batch wrote."""
    path = folder / PIECE_FILE
    if not path.exists():
        return None
    try:
        place = json.loads(path.read_text())
        spans = [place["inputs"], place["outputs"]]
        if not all(isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and v >= 0 for v in s)
                   for s in spans):
            raise ValueError(f"{PIECE_FILE} does not say where the test sits in its batch")
        examples = torch.load(folder / BATCH_INPUTS_FILE, weights_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ValueError(f"the batch program's account of this test cannot be read ({exc})") from None
    if not isinstance(examples, list) or spans[0][0] + spans[0][1] > len(examples):
        raise ValueError(f"{BATCH_INPUTS_FILE} does not hold the batch's inputs")
    return (spans[0][0], spans[0][1]), (spans[1][0], spans[1][1]), examples


def _set_threads(n: int) -> None:
    """Resize the XNNPACK threadpool to the worker's budget (process-wide, so only on change)."""
    if n <= 0:
        return
    try:
        from executorch.extension.pybindings import portable_lib as lib
    except ImportError:
        return
    get = getattr(lib, "_threadpool_get_thread_count", None)
    reset = getattr(lib, "_unsafe_reset_threadpool", None)
    if reset is not None and (get is None or get() != n):
        reset(n)
