"""ONNX Runtime: torch.onnx export to a file, an InferenceSession with one execution provider.

fp16 presets cast the module and the floating example inputs to float16 before export, so
the graph computes (and takes) float16; the runnable casts floating inputs the same way.

int8 presets (cpu): the float32 export is quantized with ONNX Runtime's own tools, the way
its users ship int8 models: `quantize_static` into QDQ form (MinMax calibration over the
calibration inputs; uint8 activations, int8 weights per channel for int8, per tensor for
int8pt) or `quantize_dynamic` (int8dyn), after ORT's `quant_pre_process`. The quantized reference is that QDQ model run
with every graph optimisation off, so each QuantizeLinear/DequantizeLinear pair computes
in float exactly as written; the session under test fuses them into ORT's integer kernels
(its `graph_optimization_level`, "all" by default): the difference is ORT's lowering.
PT2E then export is not the route: torch.onnx does not export PT2E's quantized graphs.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..core.limits import THREADS, Range
from .base import (
    CUDA,
    MACOS,
    Artifact,
    Availability,
    Backend,
    Dynamic,
    Piece,
    PiecesFailed,
    Preset,
    Quantized,
    QuantizeFailed,
    Runnable,
)
from .family_common import (
    Pieces,
    cast_inputs,
    cast_module,
    contiguous_cpu,
    export_dims,
    pieces_at_fault,
    reduced_dtype,
    script_source,
    single_file,
    thread_budget,
)
from .int8_quantizers import INT8_OPTIONS, INT8_RANGES, int8_on_cpu
from .onnx_pieces import piece_model

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
             "coreml": "CoreMLExecutionProvider"}

MODEL_FILE = "model.onnx"


@functools.lru_cache(maxsize=1)
def _available_providers() -> tuple[str, ...]:
    import onnxruntime as ort
    return tuple(ort.get_available_providers())


class OnnxBackend(Backend):
    """`onnx_<cpu|cuda|coreml>_<fp32|fp16>`, and `onnx_cpu_<int8|int8pt|int8dyn>`."""

    family = "onnx"
    devices = ("cpu", "cuda", "coreml")
    precisions = ("fp32", "fp16", "int8", "int8pt", "int8dyn")
    default_options: Mapping[str, Any] = {
        "opset": 20,                        # ONNX opset the exporter targets
        "dynamo": True,                     # torch.onnx.export(dynamo=...): False = TorchScript exporter
        "optimize": True,                   # dynamo exporter's graph optimisation pass
        "do_constant_folding": True,        # TorchScript exporter only
        "use_default_decompositions": False,  # run torch.export's default decompositions first (dynamo only)
        "export_strict": False,             # torch.export strict mode for that pre-export
        "external_data": False,             # weights in a side file (needed past 2 GB)
        "providers": None,                  # None: [the preset's device provider]
        "fallback_cpu": False,              # also register CPUExecutionProvider after the preset's
        "graph_optimization_level": "all",  # ORT: disable | basic | extended | layout | all
        "intra_op_num_threads": None,       # None: the job's thread budget
        "inter_op_num_threads": 1,
        **INT8_OPTIONS,                     # the int8 presets'; static int8's `steps` is ORT's own (measured)
        "steps": 12.0,
    }
    option_ranges = {"opset": Range(1, 99, whole=True), "intra_op_num_threads": THREADS,
                     "inter_op_num_threads": THREADS, **INT8_RANGES}
    serializes = True
    can_differentiate = False
    repro_needs = "torch, onnx, onnxscript, onnxruntime"
    bundle_runner = "run_onnx.py"
    repro_source = ""  # set below the class, from the functions export and load call

    def preset_options(self, device: str, precision: str) -> dict[str, Any]:
        # dynamic int8: the reference runs ORT's own integer kernels, so any step is a change
        return {"providers": [PROVIDERS[device]], **({"steps": 2.0} if precision == "int8dyn" else {})}

    def offers(self, device: str, precision: str) -> bool:
        return int8_on_cpu(device, precision)

    def export_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                         calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset,
                         workdir: Path, dims: Dynamic = ()) -> tuple[Artifact, Quantized]:

        scheme = preset.scheme
        assert scheme is not None
        workdir = Path(workdir)
        (workdir / "float").mkdir(parents=True, exist_ok=True)
        float_model = workdir / "float" / MODEL_FILE
        reuse_torchlib_registry()
        onnx_export(module, inputs, preset.options, float_model, dynamic_shapes=export_dims(dims or None))
        model = workdir / MODEL_FILE
        try:
            onnx_quantize(float_model, model, [contiguous_cpu(s) for s in calibration], scheme.per_channel,
                          scheme.dynamic)
            reference = self.quantized_reference(Artifact(path=workdir), inputs, preset)
            steps = onnx_output_steps(model)
        except Exception as exc:
            raise QuantizeFailed(f"{type(exc).__name__}: {exc}") from exc
        finally:
            for leftover in (workdir / "float").iterdir():
                leftover.unlink()
            (workdir / "float").rmdir()
        return Artifact(path=workdir), Quantized(reference, steps)

    def quantized_reference(self, artifact: Artifact, inputs: tuple[torch.Tensor, ...],
                            preset: Preset) -> list[torch.Tensor]:
        """The QDQ model run with every graph optimisation off (the artifact is that model:
        the session under test is what optimises it)."""
        assert artifact.path is not None
        reference_options = {**preset.options, "graph_optimization_level": "disable"}
        session = onnx_session(Path(artifact.path) / MODEL_FILE, reference_options, ["CPUExecutionProvider"], 0)
        return onnx_runner(session)(contiguous_cpu(inputs))

    def requires(self, preset: Preset) -> frozenset[str]:
        return {"cuda": frozenset({CUDA}), "coreml": frozenset({MACOS})}.get(preset.device, frozenset())

    def availability(self, preset: Preset) -> Availability:
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        can_export = not missing
        why = f"ONNX export needs {', '.join(missing)} (pip install 'opdiff-snap[onnx]')" if missing else ""
        if importlib.util.find_spec("onnxruntime") is None:
            if preset.scheme is not None:   # its quantizer is onnxruntime's
                return Availability(False, False, why or "the int8 presets quantize with onnxruntime, which is "
                                                         "not installed")
            return Availability(can_export, False, why or "onnxruntime is not installed")
        have = _available_providers()
        lacking = [p for p in self._providers(preset) if p not in have]
        if lacking:
            needs = {"CoreMLExecutionProvider": "; CoreMLExecutionProvider needs onnxruntime on macOS",
                     "CUDAExecutionProvider": "; CUDAExecutionProvider needs onnxruntime-gpu and an NVIDIA GPU"}
            reason = (f"ONNX Runtime here lacks {', '.join(lacking)} (available: {', '.join(have)})"
                      + "".join(text for provider, text in needs.items() if provider in lacking))
            return Availability(can_export, False, "; ".join(filter(None, (why, reason))))
        return Availability(can_export, True, why)

    def _providers(self, preset: Preset) -> list[str]:
        return onnx_providers(preset.options, preset.device)

    def export_dynamic(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dims: Dynamic,
                       preset: Preset, workdir: Path) -> Artifact:
        dtype = reduced_dtype(preset)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        reuse_torchlib_registry()
        onnx_export(cast_module(module, dtype), cast_inputs(inputs, dtype), preset.options, workdir / MODEL_FILE,
                    dynamic_shapes=export_dims(dims or None))
        return Artifact(path=workdir)

    def prepare_runtime(self, preset: Preset) -> None:
        import onnxruntime  # noqa: F401

    def batches(self, preset: Preset) -> bool:
        # a batch splits one in-memory model; an int8 model is quantized per test
        return not preset.options.get("external_data") and preset.scheme is None

    def export_batch(self, pieces: Sequence[Piece], preset: Preset, workdir: Path) -> list[Artifact | None]:
        """One torch.onnx.export of every piece (inputs named b<i>_in<j>), then one model per
        piece cut out of it: the nodes its outputs need, its inputs renamed in0, in1, ..."""
        import onnx

        dtype = reduced_dtype(preset)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        batch = Pieces([cast_module(p.module, dtype) for p in pieces], [len(p.inputs) for p in pieces])
        names = [f"b{i}_in{j}" for i, p in enumerate(pieces) for j in range(len(p.inputs))]
        args = cast_inputs([t for p in pieces for t in p.inputs], dtype)
        reuse_torchlib_registry()
        try:
            onnx_export(batch, args, preset.options, workdir / MODEL_FILE, input_names=names)
        except Exception as exc:
            at_fault = pieces_at_fault(exc)
            if at_fault:
                raise PiecesFailed(at_fault) from exc
            raise
        model = onnx.load(str(workdir / MODEL_FILE))
        (workdir / MODEL_FILE).unlink()
        outputs = [o.name for o in model.graph.output]
        if len(outputs) != sum(p.outputs for p in pieces):
            raise RuntimeError(f"the batch's graph has {len(outputs)} outputs; its pieces return "
                               f"{sum(p.outputs for p in pieces)}")
        artifacts: list[Artifact | None] = []
        start = 0
        for i, piece in enumerate(pieces):
            own = {f"b{i}_in{j}": f"in{j}" for j in range(len(piece.inputs))}
            try:
                cut = piece_model(model, own, outputs[start:start + piece.outputs])
                folder = workdir / f"piece{i}"
                folder.mkdir()
                onnx.save(cut, str(folder / MODEL_FILE))
                artifacts.append(Artifact(path=folder))
            except (ValueError, onnx.checker.ValidationError, OSError):
                artifacts.append(None)
            start += piece.outputs
        return artifacts

    def device_feed(self, preset: Preset, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return contiguous_cpu(cast_inputs(inputs, reduced_dtype(preset)))

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:

        assert artifact.path is not None
        path = single_file(Path(artifact.path), ".onnx")
        session = onnx_session(path, preset.options, self._providers(preset),
                               thread_budget(preset.options.get("intra_op_num_threads"), threads))
        run_session = onnx_runner(session)

        def run(inputs):
            return run_session(self.device_feed(preset, inputs))

        return run

@functools.lru_cache(maxsize=1)
def reuse_torchlib_registry() -> bool:
    """Have torch.onnx.export build its table of ATen translations once per process.

    Every export call rebuilds it from onnxscript's torchlib, regenerating the IR of some
    13,000 functions only to read their domain: about a second per call, over half of a
    small export. The table depends only on the opset, so it is built once per opset and
    each call gets a copy of it (the exporter adds to the copy, never to the original).
    False, and exports as torch has them, where torch lacks the hook this relies on."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return False
    build = getattr(_registration.ONNXRegistry, "from_torchlib", None)
    if build is None or not hasattr(_registration.ONNXRegistry(), "functions"):
        return False

    @functools.lru_cache(maxsize=None)
    def built(opset: int) -> Any:
        return build(opset_version=opset)

    def from_torchlib(cls: type, opset_version: int = _registration._constants.TORCHLIB_OPSET) -> Any:
        original = built(opset_version)
        registry = cls()
        registry._opset_version = original._opset_version
        registry.functions = {target: list(metas) for target, metas in original.functions.items()}
        return registry

    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)  # type: ignore[method-assign,assignment]
    return True


# The steps below are what check runs, and, written out as source, what a repro script
# runs (`repro_source`): they use only torch, onnxruntime, numpy and their arguments.

def onnx_providers(options: Mapping[str, Any], device: str) -> list[str]:
    """The execution providers: the preset's (or its device's), CPU appended on `fallback_cpu`."""
    providers = list(options.get("providers") or [PROVIDERS[device]])
    if options.get("fallback_cpu") and "CPUExecutionProvider" not in providers:
        providers.append("CPUExecutionProvider")
    return providers


def onnx_export(model: torch.nn.Module, args: tuple[torch.Tensor, ...], options: Mapping[str, Any],
                path: Path, input_names: list[str] | None = None, dynamic_shapes: Any = None) -> None:
    """torch.onnx.export of `model` on `args` (both already in the preset's dtype) to `path`,
    with the preset's exporter options; inputs are named in0, in1, ... (or `input_names`).
    `dynamic_shapes`: torch.export's for `model(*args)` (the TorchScript exporter gets its
    axes by input name)."""
    dynamo = bool(options.get("dynamo", True))
    if dynamic_shapes is not None:
        # For a dynamic length, torch.onnx swaps in a while-loop GRU/LSTM kernel but leaves
        # the op's dispatch cache alone, so after the first RNN a process has run, later
        # exports reuse the cached unrolled kernel and the length turns static: emptying the
        # caches makes every export the same, whatever ran in this process before.
        for rnn in (torch.ops.aten.gru.input, torch.ops.aten.lstm.input):
            getattr(rnn, "_dispatch_cache", {}).clear()   # a torch without the cache has nothing to clear
    target: Any = model
    if dynamo and options.get("use_default_decompositions"):
        target = torch.export.export(model, args, strict=bool(options.get("export_strict")),
                                     dynamic_shapes=dynamic_shapes).run_decompositions()
        dynamic_shapes = None    # the exported program carries them
    names = input_names or [f"in{i}" for i in range(len(args))]
    kwargs: dict[str, Any] = {
        "input_names": names,
        "opset_version": int(options.get("opset", 20)),
        "dynamo": dynamo,
        "external_data": bool(options.get("external_data", False)),
        "verbose": False,
    }
    if dynamo:
        kwargs["optimize"] = bool(options.get("optimize", True))
        if dynamic_shapes is not None:
            kwargs["dynamic_shapes"] = dynamic_shapes
    else:
        kwargs["do_constant_folding"] = bool(options.get("do_constant_folding", True))
        if dynamic_shapes is not None:
            kwargs["dynamic_axes"] = {name: {axis: dim.__name__ for axis, dim in spec.items()}
                                      for name, spec in zip(names, dynamic_shapes[0]) if spec}
    with torch.no_grad():
        torch.onnx.export(target, args, str(path), **kwargs)
    if not path.is_file():
        raise RuntimeError(f"torch.onnx.export wrote no file at {path}")


def onnx_quantize(source: Path, target: Path, calibration: Sequence[Sequence[torch.Tensor]], per_channel: bool,
                  dynamic: bool) -> None:
    """ONNX Runtime's quantization of the float model at `source` into `target`: its
    pre-processing (shape inference, float optimisations), then dynamic, or static QDQ
    calibrated (MinMax) on `calibration`, each sample fed like the inputs."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = source.with_name("prepared.onnx")
    quant_pre_process(str(source), str(prepared))
    source = prepared
    if dynamic:
        quantize_dynamic(str(source), str(target), per_channel=per_channel, weight_type=QuantType.QInt8)
        return
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in weights]

    class Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [onnx_feeds(names, list(s)) for s in calibration]

        def get_next(self) -> Any:
            return self.left.pop(0) if self.left else None

    quantize_static(str(source), str(target), Samples(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def onnx_output_steps(path: Path) -> list[float | None]:
    """Per graph output: the scale of the DequantizeLinear producing it (a scalar), else None."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    producer = {name: node for node in graph.node for name in node.output}
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute:
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    steps: list[float | None] = []
    for output in graph.output:
        node = producer.get(output.name)
        scale = constants.get(node.input[1]) if node is not None and node.op_type == "DequantizeLinear" else None
        steps.append(float(scale.reshape(-1)[0]) if scale is not None and scale.size == 1 and scale > 0 else None)
    return steps


def onnx_session(path: Path, options: Mapping[str, Any], providers: list[str], threads: int) -> Any:
    """An ONNX Runtime session with the preset's optimisation level and thread counts
    (`threads` intra-op threads; 0: the runtime's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if options.get("inter_op_num_threads"):
        so.inter_op_num_threads = int(options["inter_op_num_threads"])
    level = str(options.get("graph_optimization_level", "all"))
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "layout": getattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT",
                          ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    if level not in levels:
        raise ValueError(f"graph_optimization_level must be one of {tuple(levels)}, got {level!r}")
    so.graph_optimization_level = levels[level]
    return ort.InferenceSession(str(path), sess_options=so, providers=providers)


def onnx_feeds(in_names: list[str], args: list[torch.Tensor], convert: Callable[[torch.Tensor], Any] | None = None
               ) -> dict[str, Any]:
    """The session's feeds: by our names in0, in1, ... (the exporter may drop inputs the
    graph never reads), else in order; each tensor made a NumPy array, or what `convert` makes."""
    convert = convert or _to_numpy
    ours = {f"in{i}": t for i, t in enumerate(args)}
    if all(n in ours for n in in_names):
        return {n: convert(ours[n]) for n in in_names}
    if len(args) == len(in_names):
        return {n: convert(t) for n, t in zip(in_names, args)}
    raise RuntimeError(f"the ONNX graph takes {len(in_names)} inputs ({', '.join(in_names)}), got {len(args)}")


def _to_numpy(t: torch.Tensor):
    if t.dtype == torch.bfloat16:
        raise TypeError("NumPy has no bfloat16, so these bfloat16 values cannot be fed to ONNX "
                        "Runtime as an array; give a float32 or float16 input")
    return t.numpy()


_BFLOAT16 = 16   # onnx.TensorProto.BFLOAT16


def onnx_runner(session: Any) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """run(inputs) -> outputs of the session. A graph with a bfloat16 input or output, which
    NumPy cannot hold, is fed and read through ONNX Runtime's own values (OrtValue)."""
    import numpy as np

    in_names = [i.name for i in session.get_inputs()]
    bf16 = any(v.type == "tensor(bfloat16)" for v in [*session.get_inputs(), *session.get_outputs()])

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if not bf16:
            return [torch.as_tensor(np.asarray(o)) for o in session.run(None, onnx_feeds(in_names, inputs))]
        values = session.run_with_ort_values(None, onnx_feeds(in_names, inputs, _to_ort_value))
        return [_from_ort_value(v) for v in values]

    return run


def _to_ort_value(t: torch.Tensor) -> Any:
    import onnxruntime as ort

    if t.dtype != torch.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy(t.numpy())
    if not hasattr(ort.OrtValue, "ortvalue_from_numpy_with_onnx_type"):
        raise TypeError(f"onnxruntime {ort.__version__} cannot take bfloat16 values from Python; "
                        "a newer one can")
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(t.view(torch.uint16).numpy(), onnx_element_type=_BFLOAT16)


def _from_ort_value(value: Any) -> torch.Tensor:
    import ctypes

    import numpy as np

    if value.data_type() != "tensor(bfloat16)":
        return torch.as_tensor(np.asarray(value.numpy()))
    shape = list(value.shape())
    count = math.prod(shape)
    if not count:
        return torch.empty(shape, dtype=torch.bfloat16)
    raw = bytearray(ctypes.string_at(value.data_ptr(), 2 * count))   # a copy: the value's buffer is ONNX Runtime's
    return torch.frombuffer(raw, dtype=torch.bfloat16).reshape(shape)


_REPRO_GLUE = '''

OPTIONS = PRESET["options"]


def export(module, inputs):
    """The module and inputs in DTYPE, exported to an .onnx file."""
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    onnx_export(cast_module(module), tuple(cast(x) for x in inputs), OPTIONS, path)
    return path


def load(path):
    """An ONNX Runtime session on the preset's providers; run() feeds it inputs in DTYPE."""
    session = onnx_session(path, OPTIONS, onnx_providers(OPTIONS, PRESET["device"]),
                           int(OPTIONS.get("intra_op_num_threads") or 0))
    run_session = onnx_runner(session)

    def run(inputs):
        return run_session([cast(x).contiguous() for x in inputs])

    return run
'''

# What a standalone repro script runs for this family (cause/repro.py writes it out): the
# functions check runs, as source, and the glue that calls them the way export and load do.
OnnxBackend.repro_source = script_source(
    ["import math", "import tempfile", "from typing import Any, Callable, Mapping", "", "import numpy as np"],
    {"PROVIDERS": PROVIDERS, "_BFLOAT16": _BFLOAT16},
    [onnx_providers, onnx_export, onnx_session, onnx_feeds, _to_numpy, onnx_runner, _to_ort_value, _from_ort_value],
    _REPRO_GLUE)
