"""The submodule calls of a module test on the baseline, and one of them run alone.

Both run in a worker (the suite's module is user code). The call tree that travels back to
the parent is names and classes only; a submodule call is run alone by a task that rebuilds
the module in its own worker, captures that call's inputs and output there and runs it;
one scope is recorded as an ATen graph (execution/atengraph.py) by `ScopeGraphTask`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..core.errors import OpdiffError
from ..execution.atengraph import NodeGraph, export_scope
from ..execution.outputs import flat_values
from ..execution.target import build_target
from ..suite.model import Invocation, TestCase
from .alone import Piece, PieceTask


@dataclass
class CallInfo:
    """One call of one submodule (or of the module itself, name ""), in the order calls
    started. `parent` is the order of the call it happened inside (None for the outermost);
    `occurrence` counts earlier calls of the same submodule."""

    order: int
    name: str
    cls: str
    leaf: bool
    occurrence: int
    parent: int | None

    @property
    def label(self) -> str:
        return (self.name or "<root>") + (f"#{self.occurrence}" if self.occurrence else "")

    @property
    def scope(self) -> str:
        """How `opdiff repro --scope` names this call."""
        return self.name + (f"#{self.occurrence}" if self.occurrence else "")


@dataclass
class CapturedCall:
    """A call with its values (worker side only: the values may hold anything the module passes)."""

    info: CallInfo
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any = None


def _detach(x: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, x)


def _is_leaf(module: torch.nn.Module) -> bool:
    return next(iter(module.children()), None) is None


def _module_test(case: TestCase) -> None:
    if case.call.kind != "module":
        raise OpdiffError(f"test '{case.id}' is an op test: localize needs a module test (an op is "
                          "already a single layer; use `opdiff repro` for it).")


def _module_of(case: TestCase, invocation: Invocation) -> tuple[torch.nn.Module, Any]:
    """The module a module test builds, and the target that runs it."""
    _module_test(case)
    target = build_target(case, invocation)
    assert target.module is not None, "a module test builds a module"
    return target.module, target


def trace_calls(module: torch.nn.Module, run,
                want: tuple[str, int] | set[tuple[str, int]] | None = None) -> list[CapturedCall]:
    """Call `run()` with hooks on every submodule of `module` (itself included) and return
    each call, in the order calls started, with detached copies of its inputs and output.
    `want=(name, occurrence)` (or a set of them): keep the values of those calls only."""
    if isinstance(want, tuple):
        want = {want}
    calls: list[CapturedCall] = []
    stack: list[int] = []
    seen: dict[str, int] = {}
    handles = []

    def pre(name: str, leaf: bool):
        def hook(mod, args, kwargs):
            occurrence = seen.get(name, 0)
            seen[name] = occurrence + 1
            info = CallInfo(len(calls), name, type(mod).__name__, leaf, occurrence, stack[-1] if stack else None)
            keep = want is None or (name, occurrence) in want
            calls.append(CapturedCall(info, _detach(args) if keep else (), _detach(kwargs) if keep else {}))
            stack.append(info.order)
        return hook

    def post(name: str):
        def hook(mod, args, kwargs, output):
            order = stack.pop()
            call = calls[order]
            if want is None or (call.info.name, call.info.occurrence) in want:
                call.output = _detach(output)
        return hook

    for name, sub in module.named_modules():
        handles.append(sub.register_forward_pre_hook(pre(name, _is_leaf(sub)), with_kwargs=True))
        handles.append(sub.register_forward_hook(post(name), with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return calls


def capture_calls(case: TestCase, invocation: Invocation) -> list[CapturedCall]:
    """Run the module of a module test eagerly, capturing every submodule call."""
    module, target = _module_of(case, invocation)
    return trace_calls(module, target)


def capture_call(case: TestCase, invocation: Invocation, scope: str) -> tuple[torch.nn.Module, CapturedCall]:
    """The submodule named by `scope` ("name" or "name#k", the k-th call of it, "" for the
    module itself) and its call on the baseline."""
    found = capture_scopes(case, invocation, [scope])[0]
    if isinstance(found, Exception):
        raise found
    return found


def capture_scopes(case: TestCase, invocation: Invocation,
                   scopes: list[str]) -> list[tuple[torch.nn.Module, CapturedCall] | OpdiffError]:
    """capture_call for each scope, from one forward; a scope that names no call gets the
    error that says so."""
    wanted = [parse_scope(s) for s in scopes]
    module, target = _module_of(case, invocation)
    names = [n for n, _ in module.named_modules() if n]
    subs: dict[str, torch.nn.Module | OpdiffError] = {}
    for scope, (name, _) in zip(scopes, wanted):
        try:
            subs[scope] = module.get_submodule(name)
        except AttributeError:
            subs[scope] = OpdiffError(
                f"test '{case.id}': --scope '{scope}': the module has no submodule '{name}'"
                + (f"; its submodules: {', '.join(names[:30])}" if names else "; it has none") + ".")
    if all(isinstance(s, OpdiffError) for s in subs.values()):
        return [subs[s] for s in scopes]   # type: ignore[misc]
    calls = {(c.info.name, c.info.occurrence): c for c in trace_calls(module, target, set(wanted))}
    found: list[tuple[torch.nn.Module, CapturedCall] | OpdiffError] = []
    for scope, (name, occurrence) in zip(scopes, wanted):
        sub, call = subs[scope], calls.get((name, occurrence))
        if isinstance(sub, OpdiffError):
            found.append(sub)
        elif call is None:
            found.append(OpdiffError(f"test '{case.id}': --scope '{scope}': submodule '{name}' is called fewer "
                                     f"than {occurrence + 1} times on the stored inputs."))
        else:
            found.append((sub, call))
    return found


def parse_scope(scope: str) -> tuple[str, int]:
    name, _, k = (scope or "").partition("#")
    if k and not k.isdigit():
        raise OpdiffError(f"--scope '{scope}': give a submodule name, optionally with '#K' for its K-th call "
                          "counting from 0 (as `opdiff localize` prints it).")
    return name, int(k or 0)


@dataclass
class CallTree:
    calls: list[CallInfo]
    error: str | None = None     # why the calls could not be captured


@dataclass
class CallTreeTask:
    """The call tree of a module test on the baseline (see execution.job.Task)."""

    case: TestCase
    invocation: Invocation
    key: str = "calls"

    def run(self, context=None) -> CallTree:
        try:
            return CallTree([c.info for c in capture_calls(self.case, self.invocation)])
        except OpdiffError as exc:
            return self.failed(None, type(exc).__name__, str(exc))
        except Exception as exc:
            from ..core.errors import error_text
            return self.failed(None, type(exc).__name__,
                               f"the module does not run on the stored inputs: {error_text(exc)}")

    def failed(self, status, error_class, message) -> CallTree:
        head = f"capturing the submodule calls failed ({status.value}): " if status is not None else ""
        return CallTree([], head + message)


@dataclass
class SubmoduleTask(PieceTask):
    """One submodule call run alone on the target, on the baseline's inputs for it."""

    invocation: Invocation | None = None
    scope: str = ""

    def cut(self) -> Piece:
        assert self.invocation is not None
        return self._piece(*capture_call(self.case, self.invocation, self.scope))

    def _piece(self, sub: torch.nn.Module, call: CapturedCall) -> Piece:
        # a private copy: backends may cast or mutate the module they are given
        return Piece(copy.deepcopy(sub).eval(), list(call.args), dict(call.kwargs), flat_values(call.output),
                     f"test '{self.case.id}' submodule '{call.info.label}'")

    @classmethod
    def cut_together(cls, tasks: list[PieceTask]) -> list[Piece | Exception]:
        """The pieces of calls of one test, captured from one forward."""
        subs = [t for t in tasks if isinstance(t, SubmoduleTask)]
        if len(subs) != len(tasks) or subs[0].invocation is None:
            return super().cut_together(tasks)
        try:
            found = capture_scopes(subs[0].case, subs[0].invocation, [t.scope for t in subs])
        except Exception as exc:
            return [exc for _ in tasks]
        return [f if isinstance(f, Exception) else t._piece(*f) for t, f in zip(subs, found)]


@dataclass
class ScopeGraphTask:
    """Export one scope of a module test to ATen and record its nodes, in a worker."""

    case: TestCase
    invocation: Invocation
    scope: str = ""
    strict: bool = False
    key: str = "graph"
    core: bool = True          # False: the ATen ops undecomposed (execution/op_survey.py)

    def run(self, context=None) -> NodeGraph:
        try:
            sub, call = capture_call(self.case, self.invocation, self.scope)
            where = f"test '{self.case.id}' scope '{call.info.label}'"
            return export_scope(copy.deepcopy(sub).eval(), list(call.args), dict(call.kwargs), where,
                                self.scope, self.strict, self.core)
        except OpdiffError as exc:
            return self.failed(None, type(exc).__name__, str(exc))
        except Exception as exc:
            from ..core.errors import error_text
            return self.failed(None, type(exc).__name__, f"recording the ATen graph failed: {error_text(exc)}")

    def failed(self, status, error_class, message) -> NodeGraph:
        head = f"exporting the scope to ATen failed ({status.value}): " if status is not None else ""
        return NodeGraph(self.scope, error=head + message)
