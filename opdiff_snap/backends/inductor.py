"""torch.compile (TorchInductor): the compiled-versus-eager question.

Export wraps the module with `torch.compile` *and calls it once on the example inputs*, so
the compilation cost lands in export_ms and load/infer times are those of compiled code.
Nothing is serialised: the compiled module lives in memory of the process that built it.

int8 (cpu): the module is quantized through PT2E with torch's X86InductorQuantizer (weights
per channel; activations static, or dynamic for int8dyn), then compiled with Inductor's
freezing on, which lowers the quantized patterns to oneDNN's int8 kernels; the converted
module, run eagerly, is the quantized reference.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from .base import CUDA, Artifact, Availability, Dynamic, Preset, Runnable, Scheme
from .family_common import cast_inputs, cast_module, has_module, reduced_dtype, script_source
from .int8_quantizers import INT8_OPTIONS, INT8_RANGES, PT2EBackend, int8_on_cpu, x86_quantizer
from .torch_eager import device_availability, device_runner, grad_context

INT8 = ("int8", "int8dyn")   # what the x86 quantizer offers: weights per channel only


def _cxx_compiler() -> str | None:
    """The C++ compiler Inductor's CPU codegen would use, if one is on PATH."""
    for name in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        found = shutil.which(name)
        if found:
            return found
    return None


def compile_kwargs(preset: Preset) -> dict[str, Any]:
    """torch.compile's keyword arguments for an inductor preset."""
    return compile_options(preset.options)


def compile_options(opts: Mapping[str, Any]) -> dict[str, Any]:
    """torch.compile's keyword arguments for an inductor preset's options (a repro script
    runs this function too, written out as source)."""
    kwargs: dict[str, Any] = {"fullgraph": bool(opts.get("fullgraph", False)),
                              "dynamic": bool(opts.get("dynamic", False)),
                              "backend": opts.get("backend", "inductor")}
    extra = dict(opts.get("inductor_options") or {})
    if extra:
        kwargs["options"] = extra
    else:
        kwargs["mode"] = opts.get("mode") or "default"
    return kwargs


class InductorBackend(PT2EBackend):
    """`inductor_<cpu|cuda>_<fp32|fp16|bf16>`, and `inductor_cpu_<int8|int8dyn>`."""

    family = "inductor"
    devices = ("cpu", "cuda")
    precisions = ("fp32", "fp16", "bf16", *INT8)
    default_options: Mapping[str, Any] = {
        "fullgraph": False,       # True: a graph break is an export failure
        "mode": "default",        # torch.compile mode: default | reduce-overhead | max-autotune | ...
        "dynamic": False,         # torch.compile dynamic=
        "backend": "inductor",    # torch.compile backend= (e.g. aot_eager to bisect)
        "inductor_options": {},   # torch.compile options= (Inductor config keys)
        "inference_mode": True,
        # the int8 presets' (not per_channel: the x86 quantizer quantizes weights per channel only)
        **{k: v for k, v in INT8_OPTIONS.items() if k != "per_channel"},
    }
    option_ranges = INT8_RANGES
    serializes = False
    can_differentiate = True

    def requires(self, preset: Preset) -> frozenset[str]:
        return frozenset({CUDA}) if preset.device == "cuda" else frozenset()

    def offers(self, device: str, precision: str) -> bool:
        return int8_on_cpu(device, precision)

    def pt2e_quantizer(self, scheme: Scheme) -> Any:
        return x86_quantizer(scheme.dynamic)

    def lower_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], preset: Preset,
                        workdir: Path, dims: Dynamic = ()) -> Artifact:
        import torch._inductor.config as inductor_config

        with inductor_config.patch(freezing=True):   # what lowers the quantized patterns to int8 kernels
            return self.export_dynamic(module, inputs, dims, preset, workdir)

    def availability(self, preset: Preset) -> Availability:
        dev = device_availability(preset.device)
        if not dev.can_run:
            return dev
        if preset.options.get("backend", "inductor") != "inductor":
            return dev
        if preset.device == "cpu" and _cxx_compiler() is None:
            why = "Inductor's CPU code generation needs a C++ compiler (g++/clang++, or $CXX) on PATH"
            return Availability(False, False, why)
        if preset.device == "cuda" and not has_module("triton"):
            return Availability(False, False, "Inductor on CUDA needs the 'triton' package")
        return dev

    def export_dynamic(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dims: Dynamic,
                       preset: Preset, workdir: Path) -> Artifact:
        """With dims, the compiling call's inputs have those axes marked dynamic, so that
        Inductor generates code for a symbolic size (one graph for every size in range)."""
        dtype = reduced_dtype(preset)
        moved = cast_module(module, dtype).to(preset.device)
        args = cast_inputs((t.to(preset.device) for t in inputs), dtype)
        for arg, axes in zip(args, dims):
            for axis, d in axes.items():
                torch._dynamo.mark_dynamic(arg, axis, min=d.low, max=d.high)
        # One worker serves many jobs whose flat modules share a forward code object; without
        # a reset Dynamo's recompile limit would silently fall back to eager after a few.
        torch._dynamo.reset()
        compiled = torch.compile(moved, **compile_kwargs(preset))
        with grad_context(preset.options):
            compiled(*args)  # compile now, so export_ms is honest
        if preset.device == "cuda":
            torch.cuda.synchronize()
        return Artifact(obj=compiled)

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        return device_runner(artifact.obj, preset, sync=True)

    # What a standalone repro script runs for this family (cause/repro.py writes it out):
    # compile_options as source, and export and load above as the script's steps.
    repro_needs = "torch (with a C++ compiler for inductor)"
    repro_source = script_source(["from typing import Any, Mapping"], {}, [compile_options], '''

def export(module, inputs):
    """torch.compile (inductor) on DEVICE in DTYPE, called once: compiling happens here."""
    torch._dynamo.reset()
    compiled = torch.compile(cast_module(module).to(DEVICE), **compile_options(PRESET["options"]))
    with torch.no_grad():
        compiled(*[cast(x).to(DEVICE) for x in inputs])
    return compiled


def load(compiled):
    def run(inputs):
        with torch.no_grad():
            return [t.detach().cpu() for t in compiled(*[cast(x).to(DEVICE) for x in inputs])]
    return run
''')
