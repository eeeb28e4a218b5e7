"""Two test backend families that run the flat module in eager torch on the CPU.

`wrongkernel_cpu_<fp32|fp16>` has the kernel bugs a real library could ship: the outputs
of aten::exp, aten::tanh and aten::sigmoid are 2^-7 too large (relative), aten::maximum
and aten::minimum are swapped, and every final floating element is one ulp off (toward
+inf and -inf in turn), which is not a bug but rounding: it points both ways. fp16 runs the module and inputs in float16.

`splitsum_cpu_fp32` is correct, but sums in another order: mm, addmm, bmm and the
full and per-dimension sums split their reduction in two parts (a third and the rest)
and add the parts.

Both see every ATen op the module executes through a TorchDispatchMode, as a kernel
library would.
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path
from typing import Any, Mapping

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from opdiff_snap.backends.base import Artifact, Availability, Preset

aten = torch.ops.aten


class _WrongKernels(TorchDispatchMode):
    """exp, tanh and sigmoid 2^-7 too large (relative); maximum and minimum swapped."""

    SCALED = {aten.exp.default, aten.tanh.default, aten.sigmoid.default}
    SWAPPED = {aten.maximum.default: aten.minimum.default, aten.minimum.default: aten.maximum.default}
    SCALE = 1.0 + 2.0 ** -7

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.SWAPPED:
            return self.SWAPPED[func](*args, **kwargs)
        out = func(*args, **kwargs)
        if func in self.SCALED:
            out = pytree.tree_map_only(torch.Tensor, lambda t: t * self.SCALE, out)
        return out


SCALED, SWAPPED, SCALE = _WrongKernels.SCALED, _WrongKernels.SWAPPED, _WrongKernels.SCALE


def _halves(k: int) -> tuple[slice, slice]:
    """Two parts, split off the kernels' own block boundaries (powers of two)."""
    return slice(0, k // 3), slice(k // 3, k)


class _SplitSums(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.mm.default and args[0].shape[1] >= 2:
            lo, hi = _halves(args[0].shape[1])
            return aten.add.Tensor(aten.mm.default(args[0][:, lo], args[1][lo]),
                                   aten.mm.default(args[0][:, hi], args[1][hi]))
        if func is aten.bmm.default and args[0].shape[2] >= 2:
            lo, hi = _halves(args[0].shape[2])
            return aten.add.Tensor(aten.bmm.default(args[0][:, :, lo], args[1][:, lo]),
                                   aten.bmm.default(args[0][:, :, hi], args[1][:, hi]))
        if func is aten.addmm.default and args[1].shape[1] >= 2 and not kwargs:
            bias, a, b = args[:3]
            lo, hi = _halves(a.shape[1])
            return aten.add.Tensor(aten.addmm.default(bias, a[:, lo], b[lo]), aten.mm.default(a[:, hi], b[hi]))
        if func is aten.sum.default and args[0].numel() >= 2:
            flat = args[0].reshape(-1)
            lo, hi = _halves(flat.numel())
            return aten.add.Tensor(aten.sum.default(flat[lo]), aten.sum.default(flat[hi]))
        if func is aten.sum.dim_IntList and len(args) >= 2 and args[1] and len(args[1]) == 1 \
                and args[0].shape[args[1][0]] >= 2 and not kwargs.get("dtype"):
            x, (dim,) = args[0], args[1]
            keep = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
            lo, hi = _halves(x.shape[dim])
            return aten.add.Tensor(aten.sum.dim_IntList(x.narrow(dim, lo.start, lo.stop), [dim], keep),
                                   aten.sum.dim_IntList(x.narrow(dim, hi.start, hi.stop - hi.start), [dim], keep))
        return func(*args, **kwargs)


def _one_ulp_off(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return t
    ways = torch.where(torch.arange(t.numel()).reshape(t.shape) % 2 == 0, float("inf"), float("-inf"))
    return torch.nextafter(t, ways.to(t.dtype))


class _Eager:
    """Shared by both families: eager torch on the CPU under a dispatch mode."""

    devices = ("cpu",)
    default_options: Mapping[str, Any] = {}
    serializes = False
    can_differentiate = False

    def availability(self, preset: Preset) -> Availability:
        return Availability(True, True)

    def _dtype(self, preset: Preset) -> torch.dtype | None:
        return torch.float16 if preset.precision == "fp16" else None

    def export(self, module: torch.nn.Module, inputs, preset: Preset, workdir: Path) -> Artifact:
        from opdiff_snap.backends.family_common import cast_module

        return Artifact(obj=cast_module(module, self._dtype(preset)))

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0):
        from opdiff_snap.backends.family_common import cast_inputs

        module, dtype = artifact.obj, self._dtype(preset)

        def run(inputs):
            with torch.no_grad(), self.mode():
                outs = module(*cast_inputs(inputs, dtype))
            outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
            return [self.finish(t) for t in outs]

        return run

    def finish(self, t: torch.Tensor) -> torch.Tensor:
        return t


def mode_repro_source(mode: type, finish=None, imports: tuple[str, ...] = ()) -> str:
    """The `repro_source` of an eager family under `mode`: the mode's own source (and the
    finishing step's) written out, plus the run() every repro script calls."""
    parts = [*imports, "from torch.utils import _pytree as pytree",
             "from torch.utils._python_dispatch import TorchDispatchMode",
             "", "aten = torch.ops.aten", "", "", inspect.getsource(mode)]
    if finish is not None:
        parts += ["", inspect.getsource(finish)]
    parts.append(textwrap.dedent(f'''

        def run(module, inputs):
            """Eager torch on the CPU under {mode.__name__}, as the test backend runs it."""
            module = cast_module(module)
            with torch.no_grad(), {mode.__name__}():
                outs = list(module(*[cast(x) for x in inputs]))
            return [{finish.__name__ + "(t)" if finish is not None else "t"} for t in outs]
        '''))
    return "\n".join(parts)


class WrongKernelBackend(_Eager):
    family = "wrongkernel"
    precisions = ("fp32", "fp16")

    def mode(self) -> TorchDispatchMode:
        return _WrongKernels()

    def finish(self, t: torch.Tensor) -> torch.Tensor:
        return _one_ulp_off(t)

    # what a repro script runs: the same kernels, their source written into the script
    repro_needs = "torch"
    repro_source = mode_repro_source(_WrongKernels, finish=_one_ulp_off)


class SplitSumBackend(_Eager):
    family = "splitsum"
    precisions = ("fp32",)

    def mode(self) -> TorchDispatchMode:
        return _SplitSums()
