"""Where inside a module did the backend first go wrong?

1. Run the module eagerly (the baseline) on the stored inputs and weights with a forward
   hook on every leaf submodule, capturing each call's args, kwargs and output in
   execution order (a submodule called twice gives two calls).
2. For each call, wrap that submodule alone in a flat module (tensor args become graph
   inputs, everything else is baked in, outputs flattened) and run it on the target
   through the ordinary backend protocol (export -> load -> run) on the captured inputs.
3. Compare with the captured outputs under the preset's tolerance. The first call in
   execution order that is not PASS is where the divergence starts: every call before
   it reproduced the baseline from the baseline's own inputs.

Only the backend protocol is used, so it works on any backend.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..backends.base import Backend, Preset
from ..errors import OpdiffError
from ..suite.model import Invocation, TestCase, Tolerance
from ..verdicts import Verdict
from ..execution.target import build_target

# statuses that mean "the submodule ran and its output disagrees" vs "it did not run"
_RAN = frozenset({Verdict.PASS, Verdict.MISMATCH, Verdict.SHAPE_MISMATCH, Verdict.DTYPE_MISMATCH,
                  Verdict.STRUCTURE_MISMATCH})


@dataclass
class CapturedCall:
    """One call of one leaf submodule on the baseline."""

    order: int
    name: str                  # qualified name in the model ("" for the root itself)
    cls: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any


@dataclass
class SubmoduleRow:
    order: int
    name: str
    cls: str
    status: Verdict
    metrics: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    @property
    def failed_to_run(self) -> bool:
        """True when export/load/run failed (no output to compare), not a numeric mismatch."""
        return self.status not in _RAN


@dataclass
class LocalizeReport:
    test_id: str
    preset: str
    tolerance: Tolerance
    rows: list[SubmoduleRow]
    first_divergent: SubmoduleRow | None   # first row that is not PASS, in execution order
    error: str | None = None               # why localize could not run

    @property
    def divergence(self) -> str:
        """'none', 'mismatch' (ran, output outside tolerance) or 'failed' (export/load/run failed)."""
        if self.first_divergent is None:
            return "none"
        return "failed" if self.first_divergent.failed_to_run else "mismatch"

    def summary(self) -> str:
        if self.first_divergent is None:
            return (f"{self.test_id} on {self.preset}: all {len(self.rows)} submodule calls "
                    "reproduce the baseline within tolerance.")
        r = self.first_divergent
        what = "fails to run" if r.failed_to_run else "diverges"
        return (f"{self.test_id} on {self.preset}: first divergent submodule is '{r.name or '<root>'}' "
                f"({r.cls}, call #{r.order}), which {what}: {r.status}. {r.message}").strip()


def _detach(x: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def capture_calls(case: TestCase, invocation: Invocation, side: str = "a") -> list[CapturedCall]:
    """Run the module of a module test eagerly with hooks on every leaf submodule."""
    if case.call.kind != "module":
        raise OpdiffError(f"test '{case.id}' is an op test: localize needs a module test (an op is "
                          "already a single layer; use `opdiff repro` for it).")
    target = build_target(case, invocation, side)
    module = target.module
    assert module is not None
    calls: list[CapturedCall] = []
    handles = []

    def hook_for(name: str):
        def hook(mod, args, kwargs, output):
            calls.append(CapturedCall(len(calls), name, type(mod).__name__,
                                      _detach(args), _detach(kwargs), _detach(output)))
        return hook

    for name, sub in module.named_modules():
        if next(iter(sub.children()), None) is None:  # a leaf
            handles.append(sub.register_forward_hook(hook_for(name), with_kwargs=True))
    try:
        with torch.no_grad():
            target()
    finally:
        for h in handles:
            h.remove()
    return calls


class FlatCall(torch.nn.Module):
    """One submodule call as a flat module: forward(*tensor leaves of (args, kwargs)) ->
    tuple of output tensors. Non-tensor leaves are baked in; complex outputs travel as
    real [..., 2]."""

    def __init__(self, sub: torch.nn.Module, args: tuple, kwargs: dict):
        super().__init__()
        self.sub = sub
        leaves, self._spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self._slots = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        self._consts = [None if isinstance(v, torch.Tensor) else v for v in leaves]
        self.example_inputs = tuple(leaves[i] for i in self._slots)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = list(self._consts)
        for slot, t in zip(self._slots, tensors):
            leaves[slot] = t
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out = self.sub(*args, **kwargs)
        return tuple(flat_outputs(out))


def flat_outputs(out: Any) -> list[torch.Tensor]:
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return [torch.view_as_real(t) if t.is_complex() else t for t in leaves]


def _default_tolerance(case: TestCase, preset: Preset) -> Tolerance:
    from ..compare import tolerance_for
    return tolerance_for(case, preset, None)


def localize(case: TestCase, invocation: Invocation, preset: Preset,
             tol_for: Callable[[Preset], Tolerance] | None = None,
             workdir: Path | None = None, *, backend: Backend | None = None,
             calls: list[CapturedCall] | None = None) -> LocalizeReport:
    """Run every leaf submodule call alone on `preset` and find the first that diverges.

    `backend` defaults to the registry's backend for the preset (tests pass their own);
    `calls` may be intermediates stored with the golden (see calls_from_stored) instead
    of capturing them now.
    """
    from ..compare import compare
    if backend is None:
        from ..backends.registry import backend_for
        backend = backend_for(preset)
    avail = backend.availability(preset)
    if not avail.can_export:
        raise OpdiffError(f"preset '{preset.name}' cannot export on this machine ({avail.reason}); "
                          "localize needs to run the target. Try it where the preset is available.")
    tol = tol_for(preset) if tol_for is not None else _default_tolerance(case, preset)
    if calls is None:
        calls = capture_calls(case, invocation)
    if not calls:
        raise OpdiffError(f"test '{case.id}': the module called no leaf submodule, nothing to localize.")
    owner = tempfile.TemporaryDirectory(prefix="opdiff-localize-") if workdir is None else None
    root = Path(owner.name) if owner is not None else Path(workdir)
    try:
        module = build_target(case, invocation).module
        subs = dict(module.named_modules())
        rows = []
        for call in calls:
            sub = subs.get(call.name)
            if sub is None:
                raise OpdiffError(f"test '{case.id}': stored intermediates name submodule '{call.name}', "
                                  "which the module no longer has. Re-record with --intermediates.")
            rows.append(_run_one(call, sub, backend, preset, tol, root / f"{call.order:04d}", compare,
                                 can_run=avail.can_run, reason=avail.reason))
    finally:
        if owner is not None:
            owner.cleanup()
    first = next((r for r in rows if r.status is not Verdict.PASS), None)
    return LocalizeReport(case.id, preset.name, tol, rows, first)


def _run_one(call: CapturedCall, sub: torch.nn.Module, backend: Backend, preset: Preset,
             tol: Tolerance, workdir: Path, compare, can_run: bool, reason: str) -> SubmoduleRow:
    row = SubmoduleRow(call.order, call.name, call.cls, Verdict.PASS)
    # a private copy: backends may cast or mutate the module they are given
    flat = FlatCall(copy.deepcopy(sub).eval(), call.args, call.kwargs).eval()
    inputs = flat.example_inputs
    expected = flat_outputs(call.output)
    workdir.mkdir(parents=True, exist_ok=True)
    stage = Verdict.EXPORT_FAIL
    try:
        artifact = backend.export(flat, inputs, preset, workdir)
        if not can_run:
            row.status, row.message = Verdict.UNAVAILABLE, f"exported; cannot run here: {reason}"
            return row
        stage = Verdict.LOAD_FAIL
        runnable = backend.load(artifact, preset)
        stage = Verdict.INFER_FAIL
        with torch.no_grad():
            actual = list(runnable(list(inputs)))
    except Exception as exc:  # a backend failure is a finding, not a crash of localize
        row.status, row.message = stage, f"{type(exc).__name__}: {str(exc).strip()[:500]}"
        return row
    actual = [a.detach().cpu() for a in actual]
    actual = [a.to(e.dtype) if a.is_floating_point() and e.is_floating_point() else a
              for a, e in zip(actual, expected)] + actual[len(expected):]
    result = compare(expected, actual, tol)
    row.status, row.metrics, row.message = result.verdict, dict(result.metrics or {}), result.message or ""
    return row


# --- storing intermediates with a golden -------------------------------------------------

def capture_intermediates(case: TestCase, invocation: Invocation) -> dict[str, Any]:
    """Every leaf submodule call as a nested value the golden store can keep (tensor
    leaves, JSON literals): {"calls": [{"name", "class", "args", "kwargs", "output"}, ...]}.
    Non-tensor arguments that are not JSON literals cannot be stored; such a call is
    stored without args (`"args": None`) and localize then recaptures on demand."""
    from ..trees import flatten
    stored = []
    for c in capture_calls(case, invocation):
        entry = {"name": c.name, "class": c.cls, "args": list(c.args), "kwargs": dict(c.kwargs),
                 "output": c.output}
        try:
            flatten(entry)
        except TypeError:
            entry = {"name": c.name, "class": c.cls, "args": None, "kwargs": None, "output": None}
        stored.append(entry)
    return {"calls": stored}


def calls_from_stored(intermediates: dict[str, Any]) -> list[CapturedCall] | None:
    """The inverse of capture_intermediates; None when any call could not be stored
    (the caller then captures on demand)."""
    out = []
    for i, e in enumerate(intermediates.get("calls", [])):
        if e.get("args") is None:
            return None
        out.append(CapturedCall(i, e["name"], e["class"], tuple(e["args"]), dict(e["kwargs"]), e["output"]))
    return out


def format_report(report: LocalizeReport) -> str:
    """A plain-text table of every call, the first divergent one marked with '>'."""
    head = f"{'':1} {'#':>3}  {'submodule':<28} {'class':<16} {'status':<14} {'max_abs':>10} {'max_rel':>10}"
    lines = [head, "-" * len(head)]
    for r in report.rows:
        mark = ">" if r is report.first_divergent else ""
        ma, mr = r.metrics.get("max_abs"), r.metrics.get("max_rel")
        fmt = lambda v: f"{v:10.3g}" if isinstance(v, (int, float)) else f"{'-':>10}"  # noqa: E731
        lines.append(f"{mark:1} {r.order:>3}  {(r.name or '<root>'):<28} {r.cls:<16} {str(r.status):<14} "
                     f"{fmt(ma)} {fmt(mr)}")
    lines.append(report.summary())
    return "\n".join(lines)


@dataclass
class LocalizeTask:
    """localize in a worker, where the module's code may run (see execution.job.Task)."""

    case: TestCase
    invocation: Invocation
    preset: Preset
    key: str = "localize"

    def run(self) -> LocalizeReport:
        try:
            return localize(self.case, self.invocation, self.preset)
        except OpdiffError as exc:
            return self.failed(None, type(exc).__name__, str(exc))

    def failed(self, status, error_class, message) -> LocalizeReport:
        head = f"localize failed ({status.value}): " if status is not None else ""
        return LocalizeReport(self.case.id, self.preset.name, Tolerance(), [], None, error=head + message)
