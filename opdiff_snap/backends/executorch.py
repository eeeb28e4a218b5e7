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
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..core.limits import THREADS
from .base import (
    APPLE_SILICON,
    MACOS,
    QUANTIZED,
    Artifact,
    Availability,
    Delegation,
    Dynamic,
    Piece,
    Preset,
    Runnable,
    Scheme,
)
from .executorch_batch import BATCH_DEVICES, batch_place, export_batch_program
from .executorch_lowering import (
    DELEGATION_FILE,
    PROGRAM_FILE,
    delegation_of,
    executorch_edge,
    executorch_execute,
    executorch_lower,
    executorch_method,
    executorch_partitioners,
    executorch_program,
    fallback_text,
)
from .family_common import (
    IS_MACOS,
    cast_inputs,
    contiguous_cpu,
    export_program,
    has_module,
    script_source,
    single_file,
    thread_budget,
)
from .int8_quantizers import INT8_OPTIONS, INT8_RANGES, PT2EBackend, int8_on_cpu, xnnpack_quantizer

DELEGATION_MAX_BYTES = 4 << 20

_PARTITIONER_MODULES = {
    "cpu": "executorch.backends.xnnpack.partition.xnnpack_partitioner",
    "mps": "executorch.backends.apple.mps.partition",
    "coreml": "executorch.backends.apple.coreml.partition",
}


class ExecuTorchBackend(PT2EBackend):
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
    bundle_runner = "run_executorch.py"
    repro_source = ""  # set below the class, from the functions export and load call

    def preset_options(self, device: str, precision: str) -> dict[str, Any]:
        if precision in QUANTIZED:   # dynamic activations: the zoo's transformers reach 7 steps (measured)
            return {"export_fp16": False, **({"steps": 8.0} if precision == "int8dyn" else {})}
        if device == "coreml":
            return {"coreml_compute_precision": precision}
        return {"export_fp16": precision == "fp16"}

    def offers(self, device: str, precision: str) -> bool:
        return int8_on_cpu(device, precision)

    def pt2e_quantizer(self, scheme: Scheme) -> Any:
        return xnnpack_quantizer(scheme.per_channel, scheme.dynamic)

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
        return export_batch_program(pieces, preset, workdir, self.availability(preset).can_run)

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

    def device_feed(self, preset: Preset, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return contiguous_cpu(cast_inputs(inputs, torch.float16 if preset.options.get("export_fp16") else None))

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        avail = self.availability(preset)
        if not avail.can_run:
            raise RuntimeError(avail.reason)
        opts = preset.options
        _set_threads(thread_budget(opts.get("num_threads"), threads))
        assert artifact.path is not None
        method = executorch_method(single_file(Path(artifact.path), ".pte"), opts)
        place = batch_place(Path(artifact.path))

        def run(inputs):
            if place is None:
                return executorch_execute(method, self.device_feed(preset, inputs))
            (first_in, n_in), (first_out, n_out), examples = place
            args = list(examples)
            args[first_in:first_in + n_in] = inputs
            return executorch_execute(method, self.device_feed(preset, args))[first_out:first_out + n_out]

        return run


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
