"""The int8 quantization the families share: their int8 options, the PT2E quantizers
(ExecuTorch's XNNPACK one, torch's x86 Inductor one), the PT2E flow that quantizes a flat
module with either, and `PT2EBackend`, the base of the families that quantize through it.
ONNX Runtime's own quantization is the onnx family's (backends/onnx.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..core.limits import CALIBRATION_SAMPLES, NON_NEGATIVE, Range
from .base import QUANTIZED, Artifact, Backend, Dynamic, Preset, Quantized, QuantizeFailed, Scheme
from .family_common import as_output_list, contiguous_cpu, export_program

QUANTIZED_PROGRAM = "quantized.pt2"   # a dynamic int8 export's quantized model, beside its artifact

# The options every int8 family shares, with their defaults (a family whose quantizer cannot
# take `per_channel` leaves it out), and their ranges.
INT8_OPTIONS: Mapping[str, Any] = {
    "calibration_samples": 8,   # calibration inputs drawn from each test's input spec
    "per_channel": None,        # weights per channel (true) or per tensor (false); None: the precision's
    "steps": 2.0,               # lowering error allowed, in quantization steps
    "min_sqnr": None,           # quantized model against the golden below this (dB) is SQNR_LOW
}
# `steps` as a suite tolerance takes it: 0 or more (0 turns the allowance off)
INT8_RANGES: Mapping[str, Range] = {"calibration_samples": CALIBRATION_SAMPLES, "steps": NON_NEGATIVE}
# What an int8 option whose default is null takes besides null (backends/registry.py checks it).
INT8_KINDS: Mapping[str, tuple[type, str]] = {"per_channel": (bool, "true or false"),
                                              "min_sqnr": (float, "a number of dB")}


def int8_on_cpu(device: str, precision: str) -> bool:
    """`Backend.offers` of a family whose quantizer targets its cpu device alone."""
    return precision not in QUANTIZED or device == "cpu"


def xnnpack_quantizer(per_channel: bool, dynamic: bool) -> Any:
    """ExecuTorch's XNNPACK quantizer, symmetric, for the whole graph: int8 weights (per
    channel or per tensor), int8 activations (static from calibration, or dynamic). The
    ExecuTorch and CoreML int8 presets quantize with it."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic)
    return _post_training(XNNPACKQuantizer)().set_global(config)


def x86_quantizer(dynamic: bool) -> Any:
    """torch's X86InductorQuantizer with its default configuration (weights per channel)."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_dynamic=dynamic))


@functools.cache
def _post_training(quantizer: Any) -> type:
    """XNNPACK's quantizer without the patterns it declares for quantization-aware training
    only (conv-batchnorm[-relu]): its static config annotates them too, building each
    pattern's graph with torch.export at every prepare_pt2e (12 exports, 4-6 s of a test's
    10 s on ExecuTorch int8, measured), and they match nothing in the inference graphs
    quantized here (the same converted graph with and without them: tests/test_int8.py)."""
    patterns = [p for p in quantizer.SUPPORTED_PATTERNS if not p.is_qat]
    return type(f"PostTraining{quantizer.__name__}", (quantizer,), {"SUPPORTED_PATTERNS": patterns})


def pt2e_quantize(module: torch.nn.Module, inputs: Sequence[torch.Tensor],
                  calibration: Sequence[Sequence[torch.Tensor]], quantizer: Any,
                  opts: Any, dims: Dynamic = ()) -> tuple[torch.fx.GraphModule, Quantized]:
    """Quantize through PT2E (torch.export, with the axes `dims` names dynamic, prepare_pt2e
    with `quantizer`, one call per calibration sample, convert_pt2e): the converted module
    (a torch.fx.GraphModule) and its `Quantized` (its outputs on `inputs`, the quantized
    reference, with each output's step, `output_steps`). Whatever fails in here is the
    quantizer's failure: raised as QuantizeFailed."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        graph = export_program(module, inputs, opts, always_decompose=False, dynamic=dims or None).module()
        prepared = prepare_pt2e(graph, quantizer)
        with torch.no_grad():
            for sample in calibration:
                prepared(*contiguous_cpu(sample))
            converted = convert_pt2e(prepared)
            reference = as_output_list(converted(*contiguous_cpu(inputs)))
        return converted, Quantized([t.detach().clone() for t in reference], output_steps(converted))
    except Exception as exc:
        raise QuantizeFailed(f"{type(exc).__name__}: {exc}") from exc


def output_steps(graph_module: Any) -> list[float | None]:
    """Per output of a converted PT2E graph: the scale of the per-tensor dequantize that
    produces it (one quantization step of that output), or None where no dequantize does
    (activations quantized dynamically, an output computed in float)."""
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    steps: list[float | None] = []
    for node in values:
        scale = None
        if getattr(node, "op", None) == "call_function" and "dequantize_per_tensor" in str(node.target):
            raw = node.args[1]
            if getattr(raw, "op", None) == "get_attr":
                raw = getattr(graph_module, str(raw.target))
            if isinstance(raw, torch.Tensor) and raw.numel() == 1:
                raw = float(raw)
            scale = float(raw) if isinstance(raw, (int, float)) and raw > 0 else None
        steps.append(scale)
    return steps


class PT2EBackend(Backend):
    """A backend whose int8 presets quantize in torch through PT2E, with the quantizer its
    `pt2e_quantizer` names: `quantize` is `pt2e_quantize` with it, and `lower_quantized`
    lowers the converted module (or a graph cut out of it) as `export_dynamic` lowers any
    module. With dynamic dims, the converted module is kept with the artifact (saved as an
    ExportedProgram beside a serialised one, in memory otherwise) for `quantized_reference`."""

    def pt2e_quantizer(self, scheme: Scheme) -> Any:
        """The PT2E quantizer for an int8 preset's scheme."""
        raise NotImplementedError(f"the {self.family} backend names no PT2E quantizer")

    def quantize(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                 calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset,
                 dims: Dynamic = ()) -> tuple[torch.nn.Module, Quantized]:
        scheme = preset.scheme
        assert scheme is not None
        return pt2e_quantize(module, inputs, calibration, self.pt2e_quantizer(scheme), preset.options, dims)

    def lower_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], preset: Preset,
                        workdir: Path, dims: Dynamic = ()) -> Artifact:
        return self.export_dynamic(module, inputs, dims, preset, workdir)

    def export_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                         calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset,
                         workdir: Path, dims: Dynamic = ()) -> tuple[Artifact, Quantized]:
        converted, artifact, quantized = self._quantize_then_lower(module, inputs, calibration, preset, workdir, dims)
        if dims:
            if artifact.path is None:
                artifact.quantized_model = converted
            else:   # torch.export.save takes an ExportedProgram; the family's lowering keeps none
                program = export_program(converted, inputs, preset.options, always_decompose=False, dynamic=dims)
                torch.export.save(program, Path(artifact.path) / QUANTIZED_PROGRAM)
        return artifact, quantized

    def quantized_reference(self, artifact: Artifact, inputs: tuple[torch.Tensor, ...],
                            preset: Preset) -> list[torch.Tensor]:
        model = artifact.quantized_model
        if model is None:
            if artifact.path is None:
                raise ValueError("the artifact keeps no quantized model")
            model = torch.export.load(Path(artifact.path) / QUANTIZED_PROGRAM).module()
        with torch.no_grad():
            return [t.detach().clone() for t in as_output_list(model(*contiguous_cpu(inputs)))]
