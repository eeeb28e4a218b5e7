"""CoreML through coremltools: torch.export -> run_decompositions({}) -> ct.convert -> .mlpackage.

Conversion works on Linux and is done (and checked) there; prediction needs macOS, so on
Linux availability says can_run False and load raises with that reason. The fp16 presets
follow opdiff: the module exports in float32 and CoreML computes in FLOAT16
(`compute_precision`); inputs stay float32.

The int8 presets (`int8`: weights per channel, `int8pt`: per tensor; activations static)
quantize in torch through PT2E with ExecuTorch's symmetric XNNPACK quantizer and convert
the quantized graph: coremltools turns its weight dequantizes into int8 constants
(constexpr_blockwise_shift_scale from iOS18, constexpr_affine_dequantize before) and its
activation quantize/dequantize pairs into CoreML's own. coremltools 9's own PT2E
quantizer imports torch.ao.quantization.quantizer, which torch 2.13 no longer has, and its
post-conversion activation calibration runs predictions (macOS only); quantizing in torch
keeps calibration and the quantized reference on any machine. Between the quantized ops
CoreML computes in FLOAT16, as it ships.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .base import APPLE_SILICON, MACOS, QUANTIZED, Artifact, Availability, Dynamic, Preset, Runnable, Scheme
from .family_common import IS_MACOS, cast_inputs, contiguous_cpu, export_program, has_module
from .int8_quantizers import INT8_OPTIONS, INT8_RANGES, PT2EBackend, xnnpack_quantizer

COMPUTE_UNITS = {"cpu": "CPU_ONLY", "gpu": "CPU_AND_GPU", "ane": "CPU_AND_NE", "any": "ALL"}
PACKAGE_NAME = "model.mlpackage"
NOT_MACOS = "CoreML prediction needs macOS (coremltools can only convert on Linux)"

_PRECISION_NAMES = {"fp32": "FLOAT32", "float32": "FLOAT32", "FLOAT32": "FLOAT32",
                    "fp16": "FLOAT16", "float16": "FLOAT16", "FLOAT16": "FLOAT16"}


class CoreMLBackend(PT2EBackend):
    """`coreml_<cpu|gpu|ane|any>_<fp32|fp16|int8|int8pt>`."""

    family = "coreml"
    devices = ("cpu", "gpu", "ane", "any")
    precisions = ("fp32", "fp16", "int8", "int8pt")
    default_options: Mapping[str, Any] = {
        "convert_to": "mlprogram",                 # ct.convert(convert_to=...)
        "minimum_deployment_target": "iOS18",      # a ct.target name (opdiff: minimum_ios_target)
        "compute_units": None,                     # CPU_ONLY | CPU_AND_GPU | CPU_AND_NE | ALL (from the preset)
        "compute_precision": None,                 # FLOAT32 | FLOAT16 (from the preset)
        "export_fp16": False,                      # also cast module + float inputs to float16 before export
        "export_strict": False,                    # torch.export.export(strict=...)
        "use_default_decompositions": False,       # run_decompositions() instead of run_decompositions({})
        **INT8_OPTIONS,                            # the int8 presets'
    }
    option_aliases = {"minimum_ios_target": "minimum_deployment_target"}
    option_ranges = INT8_RANGES
    serializes = True
    can_differentiate = False
    bundle_runner = "run_coreml.py"

    def preset_options(self, device: str, precision: str) -> dict[str, Any]:
        compute = "FLOAT16" if precision in QUANTIZED else _PRECISION_NAMES[precision]
        return {"compute_units": COMPUTE_UNITS[device], "compute_precision": compute}

    def requires(self, preset: Preset) -> frozenset[str]:
        """Conversion runs anywhere, but a CoreML model predicts only on macOS (the Neural
        Engine only on Apple silicon)."""
        return frozenset({MACOS, APPLE_SILICON}) if preset.device == "ane" else frozenset({MACOS})

    def availability(self, preset: Preset) -> Availability:
        if not has_module("coremltools"):
            return Availability(False, False, "coremltools is not installed (pip install 'opdiff-snap[coreml]')")
        if preset.scheme is not None and not (has_module("torchao.quantization.pt2e")
                                              and has_module("executorch.backends.xnnpack.quantizer")):
            return Availability(False, False, "the CoreML int8 presets quantize with torchao's PT2E and ExecuTorch's "
                                              "XNNPACK quantizer (pip install 'opdiff-snap[executorch]')")
        if not IS_MACOS:
            return Availability(True, False, NOT_MACOS)
        return Availability(True, True)

    def export_dynamic(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dims: Dynamic,
                       preset: Preset, workdir: Path) -> Artifact:
        """coremltools reads the dynamic dims from the exported program (ranged inputs)."""
        import coremltools as ct

        opts = preset.options
        program = export_program(module, inputs, opts, always_decompose=True, dynamic=dims or None)
        kwargs: dict[str, Any] = {
            "convert_to": str(opts.get("convert_to", "mlprogram")),
            "compute_units": _enum(ct.ComputeUnit, opts.get("compute_units") or COMPUTE_UNITS[preset.device],
                                   "compute_units"),
        }
        target = opts.get("minimum_deployment_target")
        if target:
            kwargs["minimum_deployment_target"] = _enum(ct.target, target, "minimum_deployment_target")
        if kwargs["convert_to"] == "mlprogram":
            precision = _PRECISION_NAMES.get(str(opts.get("compute_precision") or preset.precision))
            if precision is None:
                raise ValueError(f"compute_precision must be FLOAT32 or FLOAT16, got {opts.get('compute_precision')!r}")
            kwargs["compute_precision"] = getattr(ct.precision, precision)
        mlmodel = ct.convert(program, **kwargs)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        mlmodel.save(str(workdir / PACKAGE_NAME))
        return Artifact(path=workdir)

    def pt2e_quantizer(self, scheme: Scheme) -> Any:
        return xnnpack_quantizer(scheme.per_channel, dynamic=False)

    def prepare_runtime(self, preset: Preset) -> None:
        import coremltools  # noqa: F401

    def device_feed(self, preset: Preset, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return contiguous_cpu(cast_inputs(inputs, torch.float16 if preset.options.get("export_fp16") else None))

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        if not IS_MACOS:
            raise RuntimeError(NOT_MACOS)
        import coremltools as ct
        import numpy as np

        opts = preset.options
        assert artifact.path is not None
        path = _package(Path(artifact.path))
        units = _enum(ct.ComputeUnit, opts.get("compute_units") or COMPUTE_UNITS[preset.device], "compute_units")
        mlmodel = ct.models.MLModel(str(path), compute_units=units)
        spec = mlmodel.get_spec()
        array_type = ct.proto.FeatureTypes_pb2.ArrayFeatureType
        np_types = {array_type.FLOAT32: np.float32, array_type.FLOAT16: np.float16,
                    array_type.INT32: np.int32, array_type.DOUBLE: np.float64}
        in_specs = [(i.name, np_types.get(i.type.multiArrayType.dataType, np.float32))
                    for i in spec.description.input]
        out_names = [o.name for o in spec.description.output]

        def run(inputs):
            args = self.device_feed(preset, inputs)
            if len(args) != len(in_specs):
                raise RuntimeError(f"the CoreML model takes {len(in_specs)} inputs, got {len(args)}")
            feeds = {name: t.numpy().astype(np_type) for (name, np_type), t in zip(in_specs, args)}
            result = mlmodel.predict(feeds)
            missing = [n for n in out_names if n not in result]
            if missing:
                raise RuntimeError(f"CoreML predict returned no {', '.join(missing)} (got {sorted(result)})")
            return [torch.as_tensor(np.asarray(result[n])) for n in out_names]

        return run

    # What a standalone repro script runs for this family (cause/repro.py writes it out;
    # it needs only torch and the runtime). Keep it in step with export and load above.
    repro_needs = "torch, coremltools (prediction needs macOS)"
    repro_source = '''
import coremltools as ct
import numpy as np

UNITS = {"cpu": ct.ComputeUnit.CPU_ONLY, "gpu": ct.ComputeUnit.CPU_AND_GPU,
         "ane": ct.ComputeUnit.CPU_AND_NE, "any": ct.ComputeUnit.ALL}[PRESET["device"]]


def run(module, inputs):
    """torch.export -> coremltools.convert (compute precision from the preset) -> predict."""
    program = torch.export.export(module.eval(), tuple(inputs)).run_decompositions({})
    precision = ct.precision.FLOAT16 if PRESET["precision"] == "fp16" else ct.precision.FLOAT32
    mlmodel = ct.convert(program, compute_units=UNITS, compute_precision=precision)
    if sys.platform != "darwin":
        print("converted; CoreML prediction needs macOS, so nothing was compared here")
        sys.exit(2)
    spec = mlmodel.get_spec()
    feeds = {i.name: x.numpy() for i, x in zip(spec.description.input, inputs)}
    out = mlmodel.predict(feeds)
    return [torch.from_numpy(np.asarray(out[o.name])) for o in spec.description.output]
'''


def _package(workdir: Path) -> Path:
    found = sorted(workdir.glob("*.mlpackage")) + sorted(workdir.glob("*.mlmodel"))
    if not found:
        raise FileNotFoundError(f"no .mlpackage in artifact directory {workdir}")
    return found[0]


def _enum(namespace: Any, name: Any, option: str) -> Any:
    value = getattr(namespace, str(name), None)
    if value is None:
        where = getattr(namespace, "__name__", namespace)
        raise ValueError(f"coreml option {option}={name!r} is not a name in {where}")
    return value
