"""Gradients, computed where user code runs (a worker): record vector-Jacobian products
on the baseline, recompute them on presets whose backend can differentiate, and check
autograd itself against central finite differences. Comparing them is compare/gradient_match.py's job.

All three use the same scalar L = sum over float outputs of sum(out * cotangent), with
a random cotangent seeded from (test id, seed) only. Its gradient w.r.t. every float
input and parameter is one vector-Jacobian product, which exercises every backward
formula on the path at the cost of one backward pass.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..backends.base import Preset
from ..core.errors import OpdiffError
from ..suite.model import Invocation, TestCase
from .job import WorkerContext
from .target import Target, build_target


def cotangent_seed(test_id: str, seed: int) -> int:
    digest = hashlib.sha256(f"{test_id}\0{seed}\0cotangent".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


@dataclass
class _Wrt:
    """The float inputs and parameters of a target, by name, made differentiable."""

    names: list[str]
    tensors: list[torch.Tensor]
    kinds: list[str]          # "input" | "param"
    call: Callable[[], Any]   # runs the target on these tensors


def _prepare(target: Target, dtype: torch.dtype | None = None, device: str = "cpu",
             compile_kwargs: dict | None = None) -> _Wrt:
    """Cast real floating tensors to dtype (None: keep) and move everything to device,
    mark float inputs and parameters requires_grad, and return the call over them
    (torch.compile'd with compile_kwargs when given)."""

    def conv(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t.to(device).clone()

    names, tensors, kinds = [], [], []
    (a_leaves, a_spec) = pytree.tree_flatten_with_path(target.args)
    (k_leaves, k_spec) = pytree.tree_flatten_with_path(target.kwargs)
    new_leaves = []
    for prefix, leaves in (("args", a_leaves), ("kwargs", k_leaves)):
        out = []
        for path, v in leaves:
            if isinstance(v, torch.Tensor):
                v = conv(v)
                if v.is_floating_point():
                    v.requires_grad_(True)
                    names.append(prefix + pytree.keystr(path))
                    tensors.append(v)
                    kinds.append("input")
            out.append(v)
        new_leaves.append(out)
    args = pytree.tree_unflatten(new_leaves[0], pytree.tree_structure(target.args))
    kwargs = pytree.tree_unflatten(new_leaves[1], pytree.tree_structure(target.kwargs))
    fn = target.fn
    if target.module is not None:
        module = target.module
        for t in list(module.parameters()) + list(module.buffers()):
            t.data = conv(t.data)
        for name, p in module.named_parameters():
            if p.is_floating_point():
                p.requires_grad_(True)
                names.append(name)
                tensors.append(p)
                kinds.append("param")
    if compile_kwargs is not None:
        torch._dynamo.reset()
        fn = torch.compile(fn, **compile_kwargs)
    return _Wrt(names, tensors, kinds, lambda: fn(*args, **kwargs))


def _float_outputs(case: TestCase, out: Any) -> list[torch.Tensor | None]:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    floats = [t if t.is_floating_point() else None for t in leaves]
    if not any(f is not None and f.requires_grad for f in floats):
        raise OpdiffError(f"test '{case.id}' has grad: true, but none of its outputs is a differentiable "
                          "float tensor. Remove `grad: true` from the test.")
    return floats


def make_cotangent(case: TestCase, seed: int, outputs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    g = torch.Generator().manual_seed(cotangent_seed(case.id, seed))
    return [None if o is None else torch.randn(o.shape, generator=g, dtype=torch.float32) for o in outputs]


def _loss(outs: list[torch.Tensor | None], cot: list[torch.Tensor | None]) -> torch.Tensor:
    terms = [(o * c.to(device=o.device, dtype=o.dtype)).sum() for o, c in zip(outs, cot)
             if o is not None and c is not None]
    return torch.stack([t.to(torch.float64) if t.dtype == torch.float64 else t.float() for t in terms]).sum()


def _vjp(wrt: _Wrt, outs: list, cot: list) -> list[torch.Tensor]:
    grads = torch.autograd.grad(_loss(outs, cot), wrt.tensors, allow_unused=True, materialize_grads=True)
    return [g.detach() for g in grads]


def _as_nested(wrt: _Wrt, grads: list[torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    out: dict[str, dict[str, torch.Tensor]] = {"inputs": {}, "params": {}}
    for name, kind, g in zip(wrt.names, wrt.kinds, grads):
        out["inputs" if kind == "input" else "params"][name] = g.cpu()
    return out


def record_grads(case: TestCase, invocation: Invocation, seed: int
                 ) -> tuple[list[torch.Tensor | None], dict[str, dict[str, torch.Tensor]]]:
    """(cotangent, grads) on the baseline (eager, the golden's dtypes, CPU).

    cotangent: one entry per output tensor leaf, a float32 tensor for float outputs and
    None otherwise. grads: {"inputs": {"args[0]": g, ...}, "params": {"fc.weight": g, ...}},
    gradients of sum(out * cotangent). A golden holds them as suite.model.RecordedGrads.
    """
    wrt = _prepare(build_target(case, invocation))
    if not wrt.tensors:
        raise OpdiffError(f"test '{case.id}' has grad: true, but it has no float inputs or parameters.")
    outs = _float_outputs(case, wrt.call())
    cot = make_cotangent(case, seed, outs)
    return cot, _as_nested(wrt, _vjp(wrt, outs, cot))


def can_differentiate(preset: Preset) -> bool:
    """Whether the preset's backend declares it can run a backward pass."""
    from ..backends.registry import backend_for

    return bool(backend_for(preset).can_differentiate)


def compute_grads(case: TestCase, invocation: Invocation, cotangent: list, preset: Preset) -> dict:
    """The same gradients recomputed on a differentiable preset, cast back to float32.
    A preset that is not eager torch runs through torch.compile with its backend's settings."""
    if not can_differentiate(preset):
        raise OpdiffError(f"preset '{preset.name}' cannot differentiate (its backend does not declare "
                          "can_differentiate); gradient parity needs one that does.")
    device = {"gpu": "cuda"}.get(preset.device, preset.device)
    dtype = None if preset.precision == "fp32" else preset.dtype
    compile_kwargs = None
    if preset.family == "inductor":
        from ..backends.inductor import compile_kwargs as inductor_kwargs

        compile_kwargs = inductor_kwargs(preset)
    wrt = _prepare(build_target(case, invocation), dtype, device, compile_kwargs)
    outs = _float_outputs(case, wrt.call())
    grads = _vjp(wrt, outs, cotangent)
    return _as_nested(wrt, [g.float() if g.is_floating_point() else g for g in grads])


# --- autograd against finite differences -------------------------------------------------

@dataclass
class GradcheckRow:
    name: str
    kind: str                 # "input" | "param"
    numel: int
    checked: int              # entries perturbed (all, or a seeded sample)
    max_abs_err: float
    worst_index: tuple[int, ...]
    autograd: float           # at the worst index
    finite_diff: float
    atol: float
    rtol: float
    passed: bool


@dataclass
class GradcheckReport:
    test_id: str
    eps: float
    rows: list[GradcheckRow] = field(default_factory=list)
    max_entries: int = 0
    error: str | None = None          # why it could not run (the worker failed, say)

    @property
    def passed(self) -> bool:
        return self.error is None and all(r.passed for r in self.rows)

    @property
    def sampled(self) -> bool:
        return any(r.checked < r.numel for r in self.rows)

    def format(self) -> str:
        lines = [f"gradcheck {self.test_id}: eps={self.eps:g}, float64, "
                 f"{'PASS' if self.passed else 'FAIL'}"]
        if self.error is not None:
            return "\n".join(lines + [f"  could not run: {self.error}"])
        head = f"  {'tensor':<20} {'kind':<6} {'checked':>11} {'max_err':>10} {'tol@worst':>10} " \
               f"{'worst':<12} {'autograd':>11} {'finite-diff':>11}  result"
        lines.append(head)
        for r in self.rows:
            tol = r.atol + r.rtol * abs(r.autograd)
            lines.append(f"  {r.name:<20} {r.kind:<6} {f'{r.checked}/{r.numel}':>11} {r.max_abs_err:10.3g} "
                         f"{tol:10.3g} {str(list(r.worst_index)):<12} {r.autograd:11.5g} {r.finite_diff:11.5g}  "
                         f"{'ok' if r.passed else 'FAIL'}")
        if self.sampled:
            lines.append(f"  (tensors above {self.max_entries} entries: a seeded sample of "
                         f"{self.max_entries} entries was perturbed)")
        return "\n".join(lines)


def step_tolerance(eps: float, loss_scale: float) -> tuple[float, float]:
    """(atol, rtol) for comparing autograd with central differences of step eps in float64.

    A central difference (L(x+e) - L(x-e)) / 2e has truncation error e^2/6 * |L'''|:
    allowing third derivatives up to ~6e3 gives 1e3 * e^2. Its roundoff: each L carries
    an error of a few ulps of the magnitude of the terms summed, u * S with u = 2^-53 and
    S = sum |out * cot|; dividing by 2e and allowing 100 ulps of accumulation gives
    100 * u * S / e. With e = 1e-6 and S ~ 10 that is ~1e-9 + ~1e-7, far below the O(1)
    relative errors of a wrong backward formula. rtol 1e-4 absorbs truncation that
    scales with the gradient itself. A larger eps raises the truncation term and a
    smaller one the roundoff term: the tolerance follows the step chosen.
    """
    u = 2.0 ** -53
    return 1e3 * eps ** 2 + 100 * u * loss_scale / eps, 1e-4


def gradcheck(case: TestCase, invocation: Invocation, eps: float = 1e-6, max_entries: int = 32,
              seed: int = 0) -> GradcheckReport:
    """Autograd vs central finite differences of L in float64, per input and parameter.

    Tensors with more than `max_entries` elements are checked on a seeded random sample
    of that many entries (the report says so).
    """
    wrt = _prepare(build_target(case, invocation), torch.float64)
    if not wrt.tensors:
        raise OpdiffError(f"test '{case.id}': no float inputs or parameters to gradcheck.")
    outs = _float_outputs(case, wrt.call())
    cot = [None if c is None else c.double() for c in make_cotangent(case, seed, outs)]
    analytic = _vjp(wrt, outs, cot)
    scale = float(sum((o.detach().double() * c).abs().sum() for o, c in zip(outs, cot)
                      if o is not None and c is not None))
    atol, rtol = step_tolerance(eps, scale)

    def loss() -> float:
        with torch.no_grad():
            return float(_loss(_float_outputs_nograd(wrt.call()), cot))

    g = torch.Generator().manual_seed(cotangent_seed(case.id, seed) ^ 0x5EED)
    report = GradcheckReport(case.id, eps, max_entries=max_entries)
    for name, kind, x, ag in zip(wrt.names, wrt.kinds, wrt.tensors, analytic):
        flat = x.detach().view(-1) if x.is_contiguous() else None
        if flat is None:
            raise OpdiffError(f"test '{case.id}': {name} is not contiguous; cannot perturb it in place.")
        n = flat.numel()
        idx = range(n) if n <= max_entries else sorted(torch.randperm(n, generator=g)[:max_entries].tolist())
        worst: tuple[float, int, float, float] | None = None  # (excess over tolerance, index, autograd, fd)
        max_err = 0.0
        ag_flat = ag.reshape(-1)
        for i in idx:
            orig = flat[i].item()
            flat[i] = orig + eps
            lp = loss()
            flat[i] = orig - eps
            lm = loss()
            flat[i] = orig
            fd = (lp - lm) / (2 * eps)
            a = float(ag_flat[i])
            err = abs(a - fd)
            excess = err - (atol + rtol * abs(a))
            max_err = max(max_err, err)
            if worst is None or excess > worst[0]:
                worst = (excess, i, a, fd)
        if worst is None:   # nothing sampled (an empty tensor): no row
            continue
        worst_index = tuple(int(v) for v in torch.unravel_index(torch.tensor(worst[1]), x.shape)) \
            if x.dim() else ()
        report.rows.append(GradcheckRow(name, kind, n, len(idx), max_err, worst_index, worst[2], worst[3],
                                        atol, rtol, worst[0] <= 0))
    return report


def _float_outputs_nograd(out: Any) -> list[torch.Tensor | None]:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return [t if t.is_floating_point() else None for t in leaves]


@dataclass
class GradcheckTask:
    """gradcheck of one (test, seed) in a worker: materialises it there (see job.Task)."""

    case: TestCase
    seed: int
    eps: float
    max_entries: int
    key: str = ""

    def run(self, context: WorkerContext = WorkerContext()) -> GradcheckReport:
        from ..core.errors import error_text
        from ..suite.materialize import materialize

        try:
            invocation = materialize(self.case, self.seed)
            return gradcheck(self.case, invocation, eps=self.eps, max_entries=self.max_entries, seed=self.seed)
        except Exception as exc:
            return self.failed(None, type(exc).__name__, error_text(exc))

    def failed(self, status, error_class, message) -> GradcheckReport:
        head = f"{status.value}: " if status is not None else ""
        return GradcheckReport(self.case.id, self.eps, max_entries=self.max_entries, error=head + message)
