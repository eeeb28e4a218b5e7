"""Where inside a module did the backend first go wrong?

1. Run the module eagerly (the baseline) on the stored inputs and weights with a forward
   hook on every leaf submodule, capturing each call's args, kwargs and output in
   execution order (a submodule called twice gives two calls).
2. For each call, wrap that submodule alone in a flat module (execution.prepare_call:
   tensor args become graph inputs, everything else is baked in, outputs flattened) and
   run it on the target as an ordinary job (execution.run_job: export -> load -> run,
   outputs cast back as for any test) on the captured inputs.
3. Compare with the captured outputs under the preset's tolerance. The first call in
   execution order that is not PASS is where the divergence starts: every call before
   it reproduced the baseline from the baseline's own inputs.

Only the backend protocol is used, so it works on any backend.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..backends.base import Backend, Preset
from ..errors import OpdiffError
from ..suite.model import Invocation, TestCase, Tolerance
from ..verdicts import RAN, Verdict
from ..execution.job import WorkerContext
from ..execution.target import build_target



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
        return self.status not in RAN


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


def _default_tolerance(case: TestCase, preset: Preset) -> Tolerance:
    from ..compare import tolerance_for
    return tolerance_for(case, preset, None)


def localize(case: TestCase, invocation: Invocation, preset: Preset,
             tol_for: Callable[[Preset], Tolerance] | None = None, *, backend: Backend | None = None,
             threads: int = 0) -> LocalizeReport:
    """Run every leaf submodule call alone on `preset` and find the first that diverges.
    `backend` defaults to the registry's backend for the preset (tests pass their own)."""
    if backend is None:
        from ..backends.registry import backend_for
        backend = backend_for(preset)
    avail = backend.availability(preset)
    if not avail.can_export:
        raise OpdiffError(f"preset '{preset.name}' cannot export on this machine ({avail.reason}); "
                          "localize needs to run the target. Try it where the preset is available.")
    tol = tol_for(preset) if tol_for is not None else _default_tolerance(case, preset)
    calls = capture_calls(case, invocation)
    if not calls:
        raise OpdiffError(f"test '{case.id}': the module called no leaf submodule, nothing to localize.")
    subs = dict(build_target(case, invocation).module.named_modules())
    rows = [_run_one(case, call, subs[call.name], preset, backend, tol, threads) for call in calls]
    first = next((r for r in rows if r.status is not Verdict.PASS), None)
    return LocalizeReport(case.id, preset.name, tol, rows, first)


def _run_one(case: TestCase, call: CapturedCall, sub: torch.nn.Module, preset: Preset, backend: Backend,
             tol: Tolerance, threads: int) -> SubmoduleRow:
    from ..compare import compare
    from ..execution import Job, prepare_call, run_job
    from ..execution.prepare import flat_values

    row = SubmoduleRow(call.order, call.name, call.cls, Verdict.PASS)
    # a private copy: backends may cast or mutate the module they are given
    prepared = prepare_call({"a": copy.deepcopy(sub).eval()}, list(call.args), dict(call.kwargs),
                            f"test '{case.id}' submodule '{call.name}'")
    outcome = run_job(Job(case=case, seed=0, invocation=None, preset=preset, repeats=1, warmup=0,
                          key=f"{call.order}", prepared=prepared), backend, threads)
    if outcome.status is not None:
        row.status, row.message = outcome.status, outcome.error_message or ""
        return row
    result = compare(flat_values(call.output), outcome.outputs, tol)
    row.status, row.metrics, row.message = result.verdict, dict(result.metrics or {}), result.message or ""
    return row


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

    def run(self, context: WorkerContext = WorkerContext()) -> LocalizeReport:
        try:
            return localize(self.case, self.invocation, self.preset, threads=context.threads)
        except OpdiffError as exc:
            return self.failed(None, type(exc).__name__, str(exc))

    def failed(self, status, error_class, message) -> LocalizeReport:
        head = f"localize failed ({status.value}): " if status is not None else ""
        return LocalizeReport(self.case.id, self.preset.name, Tolerance(), [], None, error=head + message)
