"""Hand-built test cases and invocations for the execution tests."""

from __future__ import annotations

from pathlib import Path

import torch

from opdiff_snap.execution.runner import Job
from opdiff_snap.suite.construct import construct_module
from opdiff_snap.suite.model import Call, Invocation, TestCase

HERE = Path(__file__).resolve().parent
SUITE = HERE / "execution.yaml"   # never read: file: paths resolve relative to its directory


def const(value):
    return {"type": "const", "value": value}


def op_case(target: str, id: str | None = None, **fields) -> TestCase:
    return TestCase(id=id or target.replace(":", "_"), suite=SUITE, call=Call("op", target),
                    inputs=(), kwargs={}, spec_hash=fields.pop("spec_hash", "h-" + (id or target)), **fields)


def module_case(target: str, *ctor_args, id: str | None = None, pair: Call | None = None,
                **fields) -> TestCase:
    call = Call("module", target, args=tuple(const(a) for a in ctor_args))
    return TestCase(id=id or target, suite=SUITE, call=call, inputs=(), kwargs={}, pair=pair,
                    spec_hash=fields.pop("spec_hash", "h-" + (id or target)), **fields)


def states_for(case: TestCase, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """Module states as materialize would capture them (constructed under a seed)."""
    states = {}
    for side, call in (("a", case.call), ("b", case.pair)):
        if call is not None and call.kind == "module":
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1000 + seed)
                m = construct_module(call, case.suite_dir)
            states[side] = {k: v.detach().clone() for k, v in m.state_dict().items()}
    return states


def job(case: TestCase, args, kwargs=None, preset=None, seed: int = 0, key: str = "", **kw) -> Job:
    from opdiff_snap.backends.registry import get_preset
    preset = get_preset(preset or "torch_cpu_fp32") if isinstance(preset, (str, type(None))) else preset
    inv = Invocation(args=list(args), kwargs=dict(kwargs or {}), states=states_for(case, seed))
    return Job(case=case, seed=seed, invocation=inv, preset=preset, key=key or case.id, **kw)


def x(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)
