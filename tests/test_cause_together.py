"""Pieces run in batches give each piece the verdict it gets alone."""

from __future__ import annotations

import torch
from helpers.cause import load_case
from helpers.cause.wrong_backend import PerturbingBackend

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.cause.calls import CallTreeTask, SubmoduleTask
from opdiff_snap.cause.together import BatchTask, run_pieces
from opdiff_snap.compare.tolerance import tolerance_for
from opdiff_snap.core.verdicts import NOT_DIVERGED, Verdict


def _leaf_tasks(backend):
    case, inv = load_case("net")
    preset = get_preset("torch_cpu_fp32")
    leaves = [c for c in CallTreeTask(case, inv).run().calls if c.leaf]
    return [SubmoduleTask(key=str(c.order), case=case, preset=preset, tolerance=tolerance_for(case.tolerance, preset),
                          baseline_precision="fp32", backend=backend, invocation=inv, scope=c.scope)
            for c in leaves]


class _Counting:
    def __init__(self):
        self.sent: list[object] = []

    def run(self, tasks):
        for t in tasks:
            self.sent.append(t)
            yield t.run()


def _alone(tasks):
    return {t.key: t.run().status for t in tasks}


def test_a_batch_that_only_diverges_as_a_whole_is_settled_piece_by_piece():
    # the backend perturbs every output of a program holding a Scale: the batch's other
    # pieces diverge with it, and only their runs alone clear them
    tasks = _leaf_tasks(PerturbingBackend(victim="Scale"))
    pool = _Counting()
    got = run_pieces(pool.run, tasks, NOT_DIVERGED, width=2)
    assert {k: r.status for k, r in got.items()} == _alone(tasks)
    assert [k for k, r in got.items() if r.status is Verdict.MISMATCH] == [tasks[3].key]   # scale
    assert any(isinstance(t, BatchTask) for t in pool.sent)


def test_a_batch_that_fails_to_export_is_halved_down_to_the_piece_at_fault():
    class Refusing(PerturbingBackend):
        def export(self, module, inputs, preset, workdir):
            if any(isinstance(m, torch.nn.LayerNorm) for m in module.modules()):
                raise RuntimeError("LayerNorm not supported")
            return super().export(module, inputs, preset, workdir)

    tasks = _leaf_tasks(Refusing(victim="nothing"))
    got = run_pieces(_Counting().run, tasks, NOT_DIVERGED, width=1)
    assert {k: r.status for k, r in got.items()} == _alone(tasks)
    assert "LayerNorm not supported" in got[tasks[2].key].text


def test_first_only_runs_nothing_held_back_behind_the_answer():
    tasks = _leaf_tasks(PerturbingBackend(victim="Scale"))
    pool = _Counting()
    got = run_pieces(pool.run, tasks, NOT_DIVERGED, width=2, most=2, first_only=True)
    bad = [k for k, r in got.items() if r.status not in NOT_DIVERGED]
    assert bad == [tasks[3].key]
    assert all(got[t.key].status is Verdict.PASS for t in tasks[:3])
    assert not any(t.key in got for t in tasks[4:])   # the batch after it was never sent
