"""Run one piece of a test alone on the target and judge it: the unit of work of localize.

A piece is any callable with its arguments, cut out of a test: a submodule call, one ATen
node, a range of ATen nodes. It becomes a flat module (execution.prepare_call), runs as an
ordinary job (execution.run_job: export -> load -> run, outputs cast back, a float64
reference of the piece beside it) and is compared with what the baseline computed for it
under the test's tolerance, the reference's rounding allowance included (compare).

The tasks that cut pieces (cause/calls.py, `FragmentTask` below) run in worker processes, so
a piece that crashes the backend costs only its worker: the pool turns that into a CRASH
result of that piece (`failed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..backends.base import Backend, Preset
from ..core.verdicts import Verdict
from ..execution.atengraph import Fragment
from ..execution.job import WorkerContext
from ..suite.model import TestCase, Tolerance


@dataclass
class PieceResult:
    """How one piece did on the target. `status` is a comparison verdict when it ran, else
    the failure (EXPORT_FAIL ... CRASH, TIMEOUT); `error_message` holds a failure's text
    (the pool appends what the worker printed), `message` a comparison's."""

    key: str
    status: Verdict
    metrics: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    error_message: str | None = None
    worker_pid: int | None = None

    @property
    def text(self) -> str:
        return (self.error_message or self.message or "").strip()


@dataclass
class Piece:
    """A callable cut out of a test, its arguments (tensors in place) and the flat list of
    values the baseline computed for it."""

    fn: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    expected: list[torch.Tensor]
    where: str


def cut_failed(key: str, exc: BaseException) -> PieceResult:
    from ..core.errors import error_text

    return PieceResult(key, Verdict.EXPORT_FAIL, error_message=f"cutting the piece out failed: {error_text(exc)}")


def prepare_piece(key: str, piece: Piece) -> Any:
    """`piece` as a flat module (execution.prepare.Prepared), or the PieceResult that says
    it does not run eagerly."""
    from ..core.errors import error_text
    from ..execution.prepare import prepare_call

    try:
        return prepare_call({"a": piece.fn}, list(piece.args), dict(piece.kwargs), piece.where)
    except Exception as exc:
        return PieceResult(key, Verdict.EXPORT_FAIL,
                           error_message=f"the piece does not run eagerly: {error_text(exc)}")


def run_prepared(key: str, case: TestCase, preset: Preset, prepared: Any, backend: Backend | None,
                 threads: int) -> Any:
    """Export, load and run the flat module `prepared` once on `preset` (an Outcome)."""
    from ..execution.runner import Job, run_job

    job = Job(case=case, seed=0, invocation=None, preset=preset, repeats=1, warmup=0, key=key, prepared=prepared)
    return run_job(job, backend, threads)


def run_piece(key: str, case: TestCase, preset: Preset, piece: Piece, tol: Tolerance,
              baseline_precision: str = "fp32", backend: Backend | None = None,
              threads: int = 0) -> PieceResult:
    """Run `piece` alone on `preset` and compare it with what the baseline computed."""
    prepared = prepare_piece(key, piece)
    if isinstance(prepared, PieceResult):
        return prepared
    outcome = run_prepared(key, case, preset, prepared, backend, threads)
    if outcome.status is not None:
        return PieceResult(key, outcome.status, error_message=outcome.error_message or "")
    return judge(key, preset, piece, prepared, list(outcome.outputs or []), tol, baseline_precision)


def judge(key: str, preset: Preset, piece: Piece, prepared: Any, outputs: list[torch.Tensor],
          tol: Tolerance, baseline_precision: str) -> PieceResult:
    """Compare what the target computed for `piece` (run as the flat module `prepared`) with
    the baseline, allowing for rounding as measured by the piece's own float64 reference
    (and, on fp16/bf16, its elementwise one and torch eager's own error at that precision,
    as check does)."""
    from ..compare.numerics import compare
    from ..compare.rules import Rounding
    from ..execution.outputs import nest_residuals
    from ..execution.references import (
        REDUCED,
        elementwise_reference,
        float64_reference,
        needs_control,
        precision_control,
    )

    flat = {"list": [{"tensor": i} for i in range(len(piece.expected))]}   # a piece compares flat outputs
    reference = float64_reference(prepared)[0]
    residuals = None if reference is None else nest_residuals(flat, reference, list(piece.expected))
    ew = elementwise_reference(prepared, preset.precision)[0]   # None off fp16/bf16
    elementwise = None if ew is None else nest_residuals(flat, ew, list(piece.expected))
    control = None
    if preset.precision in REDUCED:
        control = precision_control(prepared, preset.precision)[0] if needs_control(preset) else outputs
    rounding = Rounding(residuals, baseline_precision, preset.precision, elementwise,
                        None if control is None else list(control))
    result = compare(list(piece.expected), outputs, tol, rounding=rounding)
    return PieceResult(key, result.verdict, result.metrics.to_json() if result.metrics else {},
                       result.message or "")


@dataclass
class PieceTask:
    """Base of the worker tasks that cut a piece out of a test and run it alone (see
    execution.job.Task). Subclasses say how to cut (`cut`); the rest is shared."""

    key: str
    case: TestCase
    preset: Preset
    tolerance: Tolerance
    baseline_precision: str
    backend: Backend | None   # None: the registry's backend for the preset

    def cut(self) -> Piece:
        raise NotImplementedError

    @classmethod
    def cut_together(cls, tasks: list[PieceTask]) -> list[Piece | Exception]:
        """Each task's piece, or why it could not be cut (subclasses share the work)."""
        pieces: list[Piece | Exception] = []
        for t in tasks:
            try:
                pieces.append(t.cut())
            except Exception as exc:
                pieces.append(exc)
        return pieces

    def run(self, context: WorkerContext = WorkerContext()) -> PieceResult:
        try:
            piece = self.cut()
        except Exception as exc:
            return cut_failed(self.key, exc)
        return run_piece(self.key, self.case, self.preset, piece, self.tolerance, self.baseline_precision,
                         self.backend, context.threads)

    def failed(self, status: Verdict, error_class: str | None, message: str) -> PieceResult:
        return PieceResult(self.key, status, error_message=message)


@dataclass
class FragmentTask(PieceTask):
    """A fragment of a scope's ATen graph run alone on the target (see PieceTask)."""

    fragment: Fragment | None = None
    scope: str = ""

    def cut(self) -> Piece:
        assert self.fragment is not None
        fn, args, kwargs = self.fragment.call()
        where = f"test '{self.case.id}' scope '{self.scope or '<root>'}' {self.fragment.label}"
        return Piece(fn, args, kwargs, list(self.fragment.expected), where)
