"""ONNX Runtime: torch.onnx export to a file, an InferenceSession with one execution provider.

fp16 presets cast the module and the floating example inputs to float16 before export, so
the graph computes (and takes) float16; the runnable casts floating inputs the same way.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any, Mapping

import torch

from ..limits import THREADS, Range
from .base import CUDA, MACOS, Artifact, Availability, Preset, Runnable
from .common import cast_inputs, cast_module, contiguous_cpu, reduced_dtype, single_file, thread_budget

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
             "coreml": "CoreMLExecutionProvider"}

_OPT_LEVELS = ("disable", "basic", "extended", "layout", "all")

MODEL_FILE = "model.onnx"


@functools.lru_cache(maxsize=1)
def _available_providers() -> tuple[str, ...]:
    import onnxruntime as ort
    return tuple(ort.get_available_providers())


class OnnxBackend:
    """`onnx_<cpu|cuda|coreml>_<fp32|fp16>`."""

    family = "onnx"
    devices = ("cpu", "cuda", "coreml")
    precisions = ("fp32", "fp16")
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
    }
    option_ranges = {"opset": Range(1, 99, whole=True), "intra_op_num_threads": THREADS,
                     "inter_op_num_threads": THREADS}
    serializes = True
    can_differentiate = False

    def preset_options(self, device: str, precision: str) -> dict[str, Any]:
        return {"providers": [PROVIDERS[device]]}

    def requires(self, preset: Preset) -> frozenset[str]:
        return {"cuda": frozenset({CUDA}), "coreml": frozenset({MACOS})}.get(preset.device, frozenset())

    def availability(self, preset: Preset) -> Availability:
        missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
        can_export = not missing
        why = f"ONNX export needs {', '.join(missing)} (pip install 'opdiff-snap[onnx]')" if missing else ""
        if importlib.util.find_spec("onnxruntime") is None:
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
        providers = list(preset.options.get("providers") or [PROVIDERS[preset.device]])
        if preset.options.get("fallback_cpu") and "CPUExecutionProvider" not in providers:
            providers.append("CPUExecutionProvider")
        return providers

    def export(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
               preset: Preset, workdir: Path) -> Artifact:
        opts = preset.options
        dtype = reduced_dtype(preset)
        model = cast_module(module, dtype)
        args = cast_inputs(inputs, dtype)
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / MODEL_FILE
        names = [f"in{i}" for i in range(len(args))]
        dynamo = bool(opts.get("dynamo", True))
        target: Any = model
        if dynamo and opts.get("use_default_decompositions"):
            target = torch.export.export(model, args, strict=bool(opts.get("export_strict"))).run_decompositions()
        kwargs: dict[str, Any] = {
            "input_names": names,
            "opset_version": int(opts.get("opset", 20)),
            "dynamo": dynamo,
            "external_data": bool(opts.get("external_data", False)),
            "verbose": False,
        }
        if dynamo:
            kwargs["optimize"] = bool(opts.get("optimize", True))
        else:
            kwargs["do_constant_folding"] = bool(opts.get("do_constant_folding", True))
        with torch.no_grad():
            torch.onnx.export(target, args, str(path), **kwargs)
        if not path.is_file():
            raise RuntimeError(f"torch.onnx.export wrote no file at {path}")
        return Artifact(path=workdir)

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        import numpy as np
        import onnxruntime as ort

        opts = preset.options
        so = ort.SessionOptions()
        so.log_severity_level = 3
        budget = thread_budget(opts.get("intra_op_num_threads"), threads)
        if budget:
            so.intra_op_num_threads = budget
        if opts.get("inter_op_num_threads"):
            so.inter_op_num_threads = int(opts["inter_op_num_threads"])
        level = str(opts.get("graph_optimization_level", "all"))
        if level not in _OPT_LEVELS:
            raise ValueError(f"graph_optimization_level must be one of {_OPT_LEVELS}, got {level!r}")
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "layout": getattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT",
                              ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[level]
        assert artifact.path is not None
        path = single_file(Path(artifact.path), ".onnx")
        session = ort.InferenceSession(str(path), sess_options=so, providers=self._providers(preset))
        in_names = [i.name for i in session.get_inputs()]
        dtype = reduced_dtype(preset)

        def run(inputs):
            args = contiguous_cpu(cast_inputs(inputs, dtype))
            ours = {f"in{i}": t for i, t in enumerate(args)}
            if all(n in ours for n in in_names):
                # the exporter may drop inputs the graph never reads: feed by our names
                feeds = {n: _to_numpy(ours[n]) for n in in_names}
            elif len(args) == len(in_names):
                feeds = {n: _to_numpy(t) for n, t in zip(in_names, args)}
            else:
                raise RuntimeError(f"the ONNX graph takes {len(in_names)} inputs "
                                   f"({', '.join(in_names)}), got {len(args)}")
            outs = session.run(None, feeds)
            return [torch.as_tensor(np.asarray(o)) for o in outs]

        return run

    # What a standalone repro script runs for this family (cause/repro.py writes it out;
    # it needs only torch and the runtime). Keep it in step with export and load above.
    repro_needs = "torch, onnx, onnxscript, onnxruntime"
    repro_source = '''
import tempfile

import onnxruntime as ort

OPTIONS = PRESET["options"]
PROVIDERS = list(OPTIONS.get("providers") or [{"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                                                "coreml": "CoreMLExecutionProvider"}[PRESET["device"]]])
if OPTIONS.get("fallback_cpu") and "CPUExecutionProvider" not in PROVIDERS:
    PROVIDERS.append("CPUExecutionProvider")


def run(module, inputs):
    """torch.onnx.export (in DTYPE) with the preset's exporter options, then an ONNX Runtime session."""
    module, inputs = cast_module(module), tuple(cast(x) for x in inputs)
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    dynamo = OPTIONS.get("dynamo", True)
    kwargs = {"opset_version": int(OPTIONS.get("opset", 20)), "dynamo": dynamo}
    if dynamo:
        kwargs["optimize"] = OPTIONS.get("optimize", True)
    with torch.no_grad():
        torch.onnx.export(module, inputs, str(path), verbose=False, **kwargs)
    session = ort.InferenceSession(str(path), providers=PROVIDERS)
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(o) for o in session.run(None, feeds)]
'''


def _to_numpy(t: torch.Tensor):
    if t.dtype == torch.bfloat16:
        raise TypeError("ONNX Runtime's Python feeds cannot carry bfloat16 inputs (NumPy has no "
                        "bfloat16); this test needs a float32 or float16 input for ONNX presets")
    return t.numpy()
