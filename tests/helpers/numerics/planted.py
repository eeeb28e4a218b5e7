"""Six fp16 backends, each with one planted bug of a kind a real fp16 kernel library ships.

Each runs the flat module in eager torch on the CPU in float16 (weights and inputs cast,
as torch_cpu_fp16 does) and plants its bug through a TorchDispatchMode or on the final
outputs:

| preset | bug |
| --- | --- |
| bugoffset_cpu_fp16 | every final floating output gets max|output| / 1000 added (a constant offset) |
| bugsmall_cpu_fp16 | final elements smaller than max|output| / 8 come out 2^-5 too large in magnitude |
| bugapprox_cpu_fp16 | aten::gelu with approximate='none' computes the tanh approximation |
| bugdrift_cpu_fp16 | every final floating element moves one float16 ulp toward +inf |
| bugdrop_cpu_fp16 | sum and mean reductions leave out the last element of what they reduce |
| bugwrongop_cpu_fp16 | aten::sigmoid computes hardsigmoid and aten::silu hardswish |
| bugaccum_cpu_fp16 | matrix products accumulate in float16, each partial sum rounded (torch accumulates in float32) |
| bugdaz_cpu_fp16 | every op reads float16 subnormal inputs as zero (denormals-are-zero), right on every other value |

Which tests a bug reaches is measured, not assumed (bench/bench_verdicts.py): the bug
reaches a test when its outputs differ from the golden by more than torch eager's own
float16 outputs do.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from opdiff_snap.backends.base import Artifact, Availability, Preset

from .backends import mode_repro_source

aten = torch.ops.aten


class _NoMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _ApproxGelu(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is aten.gelu.default and kwargs.get("approximate", "none") == "none":
            kwargs["approximate"] = "tanh"
        return func(*args, **kwargs)


_SUMS = {aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim}


def _drop_last(x: torch.Tensor, dims: Any) -> torch.Tensor:
    """`x` without the last element of what a reduction over `dims` reads."""
    if not dims:
        return x.reshape(-1)[:-1]
    dim = dims[-1] % x.dim()
    return x.narrow(dim, 0, x.shape[dim] - 1) if x.shape[dim] > 1 else x


class _DroppedElement(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SUMS and isinstance(args[0], torch.Tensor) and args[0].numel() > 1:
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            x = _drop_last(args[0], dims)
            if func in (aten.mean.default, aten.mean.dim) and x.numel() == 0:
                return func(*args, **kwargs)
            if not dims:
                return (aten.sum.default if func is aten.sum.default else aten.mean.default)(
                    x, **{k: v for k, v in kwargs.items() if k == "dtype"})
            return func(x, *args[1:], **kwargs)
        return func(*args, **kwargs)


class _WrongOp(TorchDispatchMode):
    SWAPPED = {aten.sigmoid.default: aten.hardsigmoid.default, aten.silu.default: aten.hardswish.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.SWAPPED.get(func, func)(*args, **(kwargs or {}))


def _mm_fp16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (2-d, float16) summed term by term in float16: every partial sum rounded."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
    for k in range(a.shape[1]):
        acc = acc + a[:, k:k + 1] * b[k:k + 1, :]
    return acc


class _HalfAccumulation(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.mm.default and args[0].dtype == torch.float16:
            return _mm_fp16(args[0], args[1])
        if func is aten.addmm.default and args[1].dtype == torch.float16:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            return beta * args[0] + alpha * _mm_fp16(args[1], args[2])
        if func is aten.bmm.default and args[0].dtype == torch.float16:
            return torch.stack([_mm_fp16(x, y) for x, y in zip(args[0], args[1])])
        return func(*args, **kwargs)


class _ZeroSubnormals(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def flush(t: Any) -> Any:
            if not (isinstance(t, torch.Tensor) and t.dtype == torch.float16):
                return t
            return torch.where(t.abs() < torch.finfo(torch.float16).smallest_normal, torch.zeros_like(t), t)

        args, kwargs = pytree.tree_map(flush, (tuple(args), dict(kwargs or {})))
        return func(*args, **kwargs)


def _floating(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0


def _offset(t: torch.Tensor) -> torch.Tensor:
    finite = t[torch.isfinite(t)]
    return t + (finite.abs().max() / 1000 if finite.numel() else 0)


def _small_grown(t: torch.Tensor) -> torch.Tensor:
    finite = t[torch.isfinite(t)]
    if not finite.numel():
        return t
    small = t.abs() < finite.abs().max() / 8
    return torch.where(small, t * (1 + 2.0 ** -5), t)


def _one_ulp_up(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, float("inf")))


class _Planted:
    """Eager torch on the CPU in float16 under `mode`, outputs finished by `finish`."""

    devices = ("cpu",)
    precisions = ("fp16",)
    default_options: Mapping[str, Any] = {}
    serializes = False
    can_differentiate = False
    mode: type[TorchDispatchMode] = _NoMode

    def availability(self, preset: Preset) -> Availability:
        return Availability(True, True)

    finish = staticmethod(lambda t: t)

    def export(self, module: torch.nn.Module, inputs, preset: Preset, workdir) -> Artifact:
        from opdiff_snap.backends.family_common import cast_module

        return Artifact(obj=cast_module(module, torch.float16))

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0):
        from opdiff_snap.backends.family_common import as_output_list, cast_inputs

        module = artifact.obj

        def run(inputs):
            with torch.no_grad(), self.mode():
                outs = as_output_list(module(*cast_inputs(inputs, torch.float16)))
            return [self.finish(t) if _floating(t) else t for t in outs]

        return run


class OffsetBug(_Planted):
    family, finish = "bugoffset", staticmethod(_offset)
    # what a repro script runs: the same bug, its source written into the script
    repro_needs, repro_source = "torch", mode_repro_source(_NoMode, finish=_offset)


class SmallValuesBug(_Planted):
    family, finish = "bugsmall", staticmethod(_small_grown)


class ApproximationBug(_Planted):
    family, mode = "bugapprox", _ApproxGelu


class DriftBug(_Planted):
    family, finish = "bugdrift", staticmethod(_one_ulp_up)


class DroppedElementBug(_Planted):
    family, mode = "bugdrop", _DroppedElement


class WrongOpBug(_Planted):
    family, mode = "bugwrongop", _WrongOp


class HalfAccumulationBug(_Planted):
    family, mode = "bugaccum", _HalfAccumulation


class ZeroSubnormalsBug(_Planted):
    family, mode = "bugdaz", _ZeroSubnormals


PLANTED = {"bugoffset": OffsetBug, "bugsmall": SmallValuesBug, "bugapprox": ApproximationBug,
           "bugdrift": DriftBug, "bugdrop": DroppedElementBug, "bugwrongop": WrongOpBug}
PRESETS = tuple(f"{family}_cpu_fp16" for family in PLANTED)
# a backend that is correct op by op and only loses precision (judged against torch's own)
ACCUMULATION = "bugaccum_cpu_fp16"
ENTRY_POINT_LINES = "".join(f"{family} = helpers.numerics.planted:{cls.__name__}\n"
                            for family, cls in {**PLANTED, "bugaccum": HalfAccumulationBug}.items())
ENTRY_POINTS = "[opdiff_snap.backends]\n" + ENTRY_POINT_LINES
# wrong only on float16 subnormal inputs (tests/test_profile_precisions.py)
DAZ_ENTRY_POINTS = "[opdiff_snap.backends]\nbugdaz = helpers.numerics.planted:ZeroSubnormalsBug\n"
