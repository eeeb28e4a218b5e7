"""Eager PyTorch: the module itself, on a device, optionally in fp16 / bf16.

Export moves (and for reduced precision casts) a copy of the module; the artifact is that
in-memory module. Nothing is serialised, so the artifact cannot be cached across processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from .base import APPLE_SILICON, CUDA, MACOS, Artifact, Availability, Backend, Dynamic, Preset, Runnable
from .family_common import as_output_list, cast_inputs, cast_module, reduced_dtype


def device_availability(device: str) -> Availability:
    """Whether torch can use `device` here (shared with the inductor family)."""
    if device == "cpu":
        return Availability(True, True)
    if device == "cuda":
        if torch.cuda.is_available():
            return Availability(True, True)
        why = ("this torch build has no CUDA support" if torch.version.cuda is None
               else "no CUDA device is visible (torch.cuda.is_available() is False)")
        return Availability(False, False, f"{why}; run on a machine with an NVIDIA GPU")
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return Availability(True, True)
        return Availability(False, False, "MPS needs macOS on Apple silicon "
                                          "(torch.backends.mps.is_available() is False)")
    return Availability(False, False, f"unknown torch device '{device}'")


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def grad_context(options: Mapping[str, Any]):
    return torch.inference_mode() if options.get("inference_mode", True) else torch.no_grad()


def device_runner(call, preset: Preset, sync: bool) -> Runnable:
    """Run `call` on inputs moved to the preset's device and cast to its dtype, under its grad
    mode; outputs come back on the CPU (after waiting for the device, with `sync`)."""
    device, dtype, options = preset.device, reduced_dtype(preset), preset.options
    sync = sync and device != "cpu"

    def run(inputs):
        args = cast_inputs((t.to(device) for t in inputs), dtype)
        with grad_context(options):
            outs = as_output_list(call(*args))
        if sync:
            _synchronize(device)
        return [t.detach().cpu() for t in outs]

    return run


DEVICE_NEEDS = {"cuda": frozenset({CUDA}), "mps": frozenset({MACOS, APPLE_SILICON})}


class TorchEagerBackend(Backend):
    """`torch_<cpu|cuda|mps>_<fp32|fp16|bf16>`."""

    family = "torch"
    devices = ("cpu", "cuda", "mps")
    precisions = ("fp32", "fp16", "bf16")
    default_options: Mapping[str, Any] = {
        "inference_mode": True,   # torch.inference_mode() around calls; False: torch.no_grad()
        "synchronize": True,      # wait for the device before returning (honest GPU timings)
    }
    serializes = False
    can_differentiate = True

    def requires(self, preset: Preset) -> frozenset[str]:
        return DEVICE_NEEDS.get(preset.device, frozenset())

    def availability(self, preset: Preset) -> Availability:
        return device_availability(preset.device)

    def export_dynamic(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dims: Dynamic,
                       preset: Preset, workdir: Path) -> Artifact:
        """Eager torch runs any shape: its artifact is the module (cast, moved), whatever `dims`."""
        return Artifact(obj=cast_module(module, reduced_dtype(preset)).to(preset.device))

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        return device_runner(artifact.obj, preset, bool(preset.options.get("synchronize", True)))

    # What a standalone repro script runs for this family (cause/repro.py writes it out;
    # it needs only torch and the runtime): export and load above, step by step.
    repro_needs = "torch"
    repro_source = '''
def export(module, inputs):
    """Eager PyTorch: the module cast to DTYPE and moved to DEVICE."""
    return cast_module(module).to(DEVICE)


def load(module):
    def run(inputs):
        with torch.no_grad():
            return [t.detach().cpu() for t in module(*[cast(x).to(DEVICE) for x in inputs])]
    return run
'''
