"""Test backend families for localize at the ATen level, eager torch on the CPU under a
dispatch mode, registered through the `opdiff_snap.backends` entry point group (ENTRY_POINTS).

`fusekernel_cpu_fp32`: a fused multiply-add with a bug. aten::add.Tensor comes out 2^-7
too large (relative) when one of its inputs was produced by aten::mul.Tensor in the same
run; mul alone and add alone are right, so only the pair run together diverges.

`crashkernel_cpu_fp32`: the process dies of SIGSEGV as soon as aten::exp runs.
"""

from __future__ import annotations

import os
import signal
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..numerics.backends import WrongKernelBackend, _Eager, mode_repro_source

aten = torch.ops.aten

ENTRY_POINTS = ("[opdiff_snap.backends]\n"
                "wrongkernel = helpers.numerics.backends:WrongKernelBackend\n"
                "fusekernel = helpers.cause.kernels:FusedMulAddBackend\n"
                "crashkernel = helpers.cause.kernels:CrashBackend\n")


class _FusedMulAdd(TorchDispatchMode):
    """add(mul(a, b), c) is off by 2^-7 (relative); either op alone is exact."""

    SCALE = 1.0 + 2.0 ** -7

    def __init__(self):
        super().__init__()
        self.products = {}   # id -> weak reference of every tensor mul produced

    def made_by_mul(self, t) -> bool:
        ref = self.products.get(id(t))
        return ref is not None and ref() is t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.mul.Tensor:
            self.products[id(out)] = weakref.ref(out)
        elif func is aten.add.Tensor and any(self.made_by_mul(a) for a in args):
            out = out * self.SCALE
        return out


class FusedMulAddBackend(_Eager):
    family = "fusekernel"
    precisions = ("fp32",)

    def mode(self) -> TorchDispatchMode:
        return _FusedMulAdd()

    repro_needs = "torch"
    repro_source = mode_repro_source(_FusedMulAdd, imports=("import weakref",))


class _Segfault(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.exp.default:
            os.kill(os.getpid(), signal.SIGSEGV)
        return func(*args, **(kwargs or {}))


class CrashBackend(_Eager):
    family = "crashkernel"
    precisions = ("fp32",)

    def mode(self) -> TorchDispatchMode:
        return _Segfault()


__all__ = ["CrashBackend", "ENTRY_POINTS", "FusedMulAddBackend", "WrongKernelBackend"]
