"""Many pieces in one program: localize's way to pay for one export instead of one per piece.

A backend's export, lowering and load cost seconds of fixed overhead whatever the size of
the graph (ExecuTorch most), so running 150 one-layer pieces alone costs minutes. A
BatchTask builds one flat module that runs each of its pieces on its own recorded inputs
and returns all of their outputs; the pieces share no value, so no op of one can be fused
with an op of another. The target runs it once; each piece's outputs are then judged
exactly as if it had run alone (cause.alone.judge: its own float64 and elementwise
references).

A batch is a screen, never the final word on a divergence: `run_pieces` reruns alone every
piece that does not pass in its batch (a backend may treat a whole program differently
from its parts), and splits a batch that fails as a whole (export, lowering, load, crash,
timeout) in halves until the piece at fault runs alone. So a piece's verdict is what it
gets alone, except that one that passes inside a batch is taken as passing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..backends.family_common import Pieces
from ..core.verdicts import Verdict
from ..execution.job import WorkerContext
from .alone import Piece, PieceResult, PieceTask, cut_failed, judge, prepare_piece, run_prepared

MOST = 48   # pieces in one batch at most: a failing batch is halved, so this bounds the retries


@dataclass
class BatchResult:
    """What a batch did: `results` (one per piece, in order) when the program ran; else
    the failure of the whole program (`status`, `error_message`)."""

    key: str
    status: Verdict | None
    results: list[PieceResult] = field(default_factory=list)
    error_message: str | None = None
    worker_pid: int | None = None


@dataclass
class BatchTask:
    """Pieces (PieceTasks of one test and preset) exported and run as one program."""

    key: str
    tasks: list[PieceTask]

    @property
    def preset(self) -> Any:   # where a distributed pool routes it
        return self.tasks[0].preset

    def run(self, context: WorkerContext = WorkerContext()) -> BatchResult:
        from ..core.errors import error_text
        from ..execution.prepare import prepare_call

        head = self.tasks[0]
        done: dict[int, PieceResult] = {}
        kept: list[tuple[int, Piece, Any]] = []
        for i, (task, piece) in enumerate(zip(self.tasks, type(head).cut_together(self.tasks))):
            if isinstance(piece, Exception):
                done[i] = cut_failed(task.key, piece)
                continue
            prepared = prepare_piece(task.key, piece)
            if isinstance(prepared, PieceResult):
                done[i] = prepared
                continue
            if not prepared.out_dtypes:   # nothing to compare: alone, it says so
                done[i] = PieceResult(task.key, Verdict.STRUCTURE_MISMATCH, error_message="no tensor output")
                continue
            kept.append((i, piece, prepared))
        if kept:
            inputs = [t for _, _, p in kept for t in p.inputs]
            try:
                whole = prepare_call({"a": Pieces([p.module for _, _, p in kept],
                                                     [len(p.inputs) for _, _, p in kept])},
                                     inputs, {}, f"test '{head.case.id}' {len(kept)} pieces together")
            except Exception as exc:
                return BatchResult(self.key, Verdict.EXPORT_FAIL, error_message=error_text(exc))
            outcome = run_prepared(self.key, head.case, head.preset, whole, head.backend, context.threads)
            if outcome.status is not None:
                return BatchResult(self.key, outcome.status, error_message=outcome.error_message)
            outputs = list(outcome.outputs or [])
            at = 0
            for i, piece, prepared in kept:
                n = len(prepared.out_dtypes)
                done[i] = judge(self.tasks[i].key, head.preset, piece, prepared, outputs[at:at + n],
                                head.tolerance, head.baseline_precision)
                at += n
        return BatchResult(self.key, None, [done[i] for i in range(len(self.tasks))])

    def failed(self, status: Verdict, error_class: str | None, message: str) -> BatchResult:
        return BatchResult(self.key, status, error_message=message)


def _groups(tasks: list[PieceTask], width: int, most: int) -> list[list[PieceTask]]:
    """Consecutive groups, as many as the pool has workers (more when they would exceed `most`)."""
    if not tasks:
        return []
    count = max(min(width, len(tasks)), -(-len(tasks) // most))
    size = -(-len(tasks) // count)
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


def run_pieces(run: Callable[[Iterable[Any]], Iterator[Any]], tasks: list[Any], fine: frozenset[Verdict],
               width: int, first_only: bool = False, most: int = MOST) -> dict[str, PieceResult]:
    """Each piece's result, by key, running them in batches on `run` (a pool's run).
    `tasks`: PieceTasks; with `most` 1 (no batch), any task whose result is a PieceResult.

    `fine`: the verdicts that pass. `first_only`: only the first piece, in the order given,
    that does not pass matters: pieces after it are not run (those already handed to a
    worker finish), so the result may lack them."""
    order = {t.key: i for i, t in enumerate(tasks)}
    results: dict[str, PieceResult] = {}
    todo = _groups(tasks, width, most)
    while todo:
        later = _round(run, todo, order, fine, first_only, results)
        if first_only:
            bad = [order[k] for k, r in results.items() if r.status not in fine]
            if bad:
                later = [g for g in later if order[g[0].key] < min(bad)]
        todo = sorted(later, key=lambda g: order[g[0].key])
    return results


def _round(run: Callable[[Iterable[Any]], Iterator[Any]], todo: list[list[PieceTask]], order: dict[str, int],
           fine: frozenset[Verdict], first_only: bool, results: dict[str, PieceResult]) -> list[list[PieceTask]]:
    """Run each group (one piece alone, several as a batch) and keep the verdicts that are
    final; return what is left to run: halves of failed batches, pieces to rerun alone, and
    (`first_only`) groups held back behind a piece that may be the answer."""
    later: list[list[PieceTask]] = []
    cut: list[int | None] = [None]   # the first piece seen not to pass (alone or in a batch)

    def note(i: int) -> None:
        if cut[0] is None or i < cut[0]:
            cut[0] = i

    def feed() -> Iterator[Any]:
        for g in todo:
            if first_only and cut[0] is not None and order[g[0].key] > cut[0]:
                later.append(g)
            else:
                yield g[0] if len(g) == 1 else BatchTask(g[0].key, g)

    groups = {g[0].key: g for g in todo}
    for r in run(feed()):
        if not isinstance(r, BatchResult):
            results[r.key] = r
            if r.status not in fine:
                note(order[r.key])
            continue
        g = groups[r.key]
        if r.status is not None:   # the program as a whole failed: halve it
            half = (len(g) + 1) // 2
            later += [g[:half], g[half:]]
            note(order[g[0].key])
            continue
        for task, res in zip(g, r.results):
            if res.status in fine:
                results[task.key] = res
            else:
                later.append([task])   # rerun alone: that is its verdict
                note(order[task.key])
    return later
