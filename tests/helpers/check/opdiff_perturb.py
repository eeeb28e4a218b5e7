"""A deliberately wrong backend family, `perturb_cpu_fp32`, for testing `opdiff check`.

It runs the flat module in eager torch, like `torch_cpu_fp32`, and then does what its
preset options ask. It learns which ATen ops the module executes the way a real kernel
library would: by being the one that runs them (a TorchDispatchMode sees every op call).

    perturb:  ["aten::exp", ...]  the outputs of these ops get `delta` added, wherever
                                  they run (an op test, or inside a module)
    delta:    amount for `perturb`
    offset:   added to every floating output of the module (exact for powers of two)
    move_nan: in every floating output holding a NaN, the first NaN becomes 0 and the
              first non-NaN element becomes NaN
    cast:     a dtype name ("float64") every floating output is cast to
    append:   every output gets one more element along dim 0 (a 0-d output becomes 1-d)
    daz:      subnormal floating inputs read as zero (denormals-are-zero, as some hardware
              and fast-math kernels do)
    sleep_s:  seconds each call sleeps first (a slow backend)
    hold_dir, hold_after: every call past the first `hold_after` (counted across worker
              processes by files in `hold_dir`) waits until `hold_dir/open` exists: a run
              that is surely mid-way when a test kills it, and resumes once opened

Registered through the entry point group `opdiff_snap.backends` by the tests
(tests/test_check_*.py write a *.dist-info with entry_points.txt pointing here).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from opdiff_snap.backends.base import Artifact, Availability, Preset


class _WrongKernels(TorchDispatchMode):
    """Adds `delta` to the floating outputs of the named ops."""

    def __init__(self, names: set[str], delta: float):
        super().__init__()
        self.names, self.delta = names, delta

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._schema.name in self.names or str(func) in self.names:
            out = pytree.tree_map_only(
                torch.Tensor, lambda t: t + self.delta if t.is_floating_point() else t, out)
        return out


def _move_nan(t: torch.Tensor) -> torch.Tensor:
    flat = t.clone().reshape(-1)
    nan = torch.isnan(flat)
    if not nan.any() or nan.all():
        return t
    flat[int(nan.nonzero()[0])] = 0.0
    flat[int((~nan).nonzero()[0])] = float("nan")
    return flat.reshape(t.shape)


def _flush_subnormal(t: Any) -> Any:
    if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
        return t
    tiny = torch.finfo(t.dtype).smallest_normal
    return torch.where(t.abs() < tiny, torch.zeros_like(t), t)


def _append(t: torch.Tensor) -> torch.Tensor:
    t = t.reshape(1) if t.dim() == 0 else t
    return torch.cat([t, torch.zeros((1, *t.shape[1:]), dtype=t.dtype)])


def _hold(folder: Path, after: int) -> None:
    calls = folder / "calls"
    calls.mkdir(parents=True, exist_ok=True)
    (calls / f"{os.getpid()}-{time.monotonic_ns()}").touch()
    if len(list(calls.iterdir())) <= after:
        return
    while not (folder / "open").exists():
        time.sleep(0.05)


class PerturbBackend:
    family = "perturb"
    devices = ("cpu",)
    precisions = ("fp32",)
    default_options: Mapping[str, Any] = {"perturb": [], "delta": 1e-2, "offset": 0.0,
                                          "move_nan": False, "cast": "", "append": False, "daz": False, "sleep_s": 0.0,
                                          "hold_dir": "", "hold_after": 0}
    serializes = False
    can_differentiate = False

    def availability(self, preset: Preset) -> Availability:
        return Availability(True, True)

    def export(self, module: torch.nn.Module, inputs, preset: Preset, workdir: Path) -> Artifact:
        return Artifact(obj=module)

    def export_dynamic(self, module: torch.nn.Module, inputs, dims, preset: Preset, workdir: Path) -> Artifact:
        return Artifact(obj=module)   # eager: any shape

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0):
        module, opts = artifact.obj, dict(preset.options)
        names = set(opts["perturb"])

        def run(inputs):
            time.sleep(float(opts["sleep_s"]))
            if opts["hold_dir"]:
                _hold(Path(opts["hold_dir"]), int(opts["hold_after"]))
            if opts["daz"]:
                inputs = [_flush_subnormal(t) for t in inputs]
            with torch.no_grad():
                if names:
                    with _WrongKernels(names, float(opts["delta"])):
                        outs = module(*inputs)
                else:
                    outs = module(*inputs)
            outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
            result = []
            for t in outs:
                if t.is_floating_point():
                    if opts["offset"]:
                        t = t + opts["offset"]
                    if opts["move_nan"]:
                        t = _move_nan(t)
                    if opts["cast"]:
                        t = t.to(getattr(torch, opts["cast"]))
                if opts["append"]:
                    t = _append(t)
                result.append(t)
            return result

        return run


class StaticOnlyBackend(PerturbBackend):
    """The perturbing backend without `export_dynamic`: a family that exports static shapes only."""

    family = "staticonly"
    export_dynamic = None
