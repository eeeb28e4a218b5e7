"""One seeded realisation of a test case: concrete inputs and module states.

Inputs come from a CPU `torch.Generator` seeded from sha256(test id, seed) only, so
other tests never affect them. Modules are constructed under `torch.manual_seed` of
the same number (global RNG state is restored afterwards), so the two sides of a
pair with same-shaped parameters get identical weights.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import torch

from . import dynamic
from .construct import build_value, construct_module, where_of
from .edge_values import apply_profile
from .fields import dtype_family
from .model import Invocation, Node, TestCase
from .profiles import NORMAL, base_id


def derive_seed(test_id: str, seed: int) -> int:
    digest = hashlib.sha256(f"{test_id}\0{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


class Sampler:
    """Samples resolved nodes (full form, see resolve.py) from one generator, in call order."""

    def __init__(self, generator: torch.Generator, suite_dir: Path, import_dirs: tuple[Path, ...] = (),
                 profile: str = NORMAL, profile_generator: torch.Generator | None = None):
        self.g = generator
        self.suite_dir = suite_dir
        self.import_dirs = import_dirs
        self.profile = profile
        self.profile_g = profile_generator

    def __call__(self, node: Node) -> Any:
        t = node["type"]
        if t == "tensor":
            return self.tensor(node["shape"], node["dtype"], node)
        if t == "scalar_tensor":
            if "value" in node:
                out = self._profiled(torch.tensor(node["value"], dtype=getattr(torch, node["dtype"])))
                return out.requires_grad_(True) if node.get("requires_grad") else out
            return self.tensor([], node["dtype"], node)
        if t == "const_tensor":
            if "value" in node:
                return self._profiled(torch.tensor(node["value"], dtype=getattr(torch, node["dtype"]))
                                      .reshape(node["shape"]))
            return self.tensor(node["shape"], node["dtype"], node)
        if t == "scalar":
            return self.scalar(node)
        if t == "const":
            return copy.deepcopy(node["value"])
        if t == "int_list":
            return list(node["elems"])
        if t == "list":
            return [self(node["elem"]) for _ in range(node["len"])]
        if t == "tuple":
            return tuple(self(e) for e in node["elems"])
        if t == "optional":
            u = torch.rand(1, generator=self.g, dtype=torch.float64).item()
            return None if u < node["p_none"] else self(node["elem"])
        if t in ("construct", "module"):
            return build_value(node, self.suite_dir, self, self.import_dirs)
        raise ValueError(f"cannot sample a '{t}' node")

    def _real(self, shape: list[int], dtype: torch.dtype, node: Node) -> torch.Tensor:
        init, g = node["init"], self.g
        if init == "normal":
            return torch.randn(shape, generator=g, dtype=dtype) * node["std"] + node["mean"]
        if init == "uniform":
            return node["low"] + (node["high"] - node["low"]) * torch.rand(shape, generator=g, dtype=dtype)
        if init == "randint":
            return torch.randint(node["low"], node["high"] + 1, shape, generator=g, dtype=torch.int64)
        if init == "bernoulli":
            return torch.bernoulli(torch.full(shape, node["p"], dtype=torch.float32), generator=g)
        if init == "zeros":
            return torch.zeros(shape, dtype=dtype)
        if init == "ones":
            return torch.ones(shape, dtype=dtype)
        raise ValueError(f"unknown init {init!r}")

    def tensor(self, shape: list[int], dtype_name: str, node: Node) -> torch.Tensor:
        dtype = getattr(torch, dtype_name)
        fam = dtype_family(dtype_name)
        base = torch.float64 if dtype_name in ("float64", "complex128") else torch.float32
        if fam == "complex":
            real, imag = self._real(shape, base, node), self._real(shape, base, node)
            out = torch.complex(real.to(base), imag.to(base)).to(dtype)
        else:
            out = self._real(shape, base, node).to(dtype)
        out = self._profiled(out)
        if node.get("requires_grad"):
            out.requires_grad_(True)
        return out

    def _profiled(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.profile_g is None else apply_profile(self.profile, t, self.profile_g)

    def scalar(self, node: Node) -> Any:
        fam = dtype_family(node["dtype"])
        if "value" in node:
            return node["value"]
        if fam == "bool":
            return bool(torch.rand(1, generator=self.g, dtype=torch.float64).item() < node["p"])
        if fam == "int":
            return int(torch.randint(node["low"], node["high"] + 1, (1,), generator=self.g).item())
        u = torch.rand(1, generator=self.g, dtype=torch.float64).item()
        return float(node["low"] + (node["high"] - node["low"]) * u)


def _as_real(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.is_complex():
        out = torch.view_as_real(x.detach()).clone()
        return out.requires_grad_(True) if x.requires_grad else out
    return x


def sample_inputs(case: TestCase, s: int) -> tuple[list[Any], dict[str, Any]]:
    """The call's args and kwargs sampled from the generator seeded with `s`, then
    rewritten by the case's input profile from a generator of its own (so what a profile
    keeps is exactly the normal golden's input)."""
    rewrite = None if case.profile == NORMAL else torch.Generator(device="cpu").manual_seed(
        derive_seed(f"{s}\0profile\0{case.profile}", 0))
    sampler = Sampler(torch.Generator(device="cpu").manual_seed(s), case.suite_dir, case.import_dirs,
                      case.profile, rewrite)
    args = [sampler(n) for n in case.inputs]
    kwargs = {k: sampler(v) for k, v in case.kwargs.items()}
    if case.cast_input0_to_complex and args:
        args[0] = _as_real(args[0])
    return args, kwargs


def calibration_seed(test_id: str, seed: int, k: int) -> int:
    """The generator seed of the k-th calibration sample of (test, seed): a stream of its
    own, apart from the golden's inputs."""
    return derive_seed(f"{test_id}\0calibration\0{k}", seed)


def materialize(case: TestCase, seed: int) -> Invocation:
    """The inputs and module states of (case, seed); bit-identical for the same pair. A
    profile's golden draws from the seed of the test it varies: the same weights, and the
    same inputs before the profile rewrites them."""
    s = derive_seed(dynamic.seed_id(base_id(case.id, case.profile), case.definition), seed)
    args, kwargs = sample_inputs(case, s)
    states: dict[str, dict[str, torch.Tensor]] = {}
    for side, call in (("a", case.call), ("b", case.pair)):
        if call is None or call.kind != "module":
            continue
        ctor_sampler = Sampler(torch.Generator(device="cpu").manual_seed(s), case.suite_dir, case.import_dirs)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s)
            module = construct_module(call, case.suite_dir, ctor_sampler, case.import_dirs, where_of(case))
        states[side] = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return Invocation(args=args, kwargs=kwargs, states=states)
