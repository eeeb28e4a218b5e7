"""Gradients computed in workers: record on the baseline, recompute on differentiable
presets (compared by compare.compare_grads), and gradcheck against finite differences."""

from __future__ import annotations

import pytest
import torch
from helpers.cause import load_case

from opdiff_snap.compare.gradient_match import compare_grads
from opdiff_snap.compare.tolerance import tolerance_for
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.gradients import (
    GradcheckTask,
    compute_grads,
    gradcheck,
    record_grads,
    step_tolerance,
)
from opdiff_snap.suite.model import RecordedGrads


def _preset(name):
    from opdiff_snap.backends.registry import get_preset
    return get_preset(name)


def check_grads(case, inv, cot, grads, preset):
    return compare_grads(grads, compute_grads(case, inv, cot, preset), tolerance_for(case, preset))


def test_wrong_backward_is_flagged_and_correct_twin_passes():
    bad = gradcheck(*load_case("cube_bad"))
    good = gradcheck(*load_case("cube_good"))
    assert good.passed, good.format()
    assert not bad.passed
    # every tensor upstream of the wrong backward is flagged, with a large error
    assert {r.name for r in bad.rows if not r.passed} == {"args[0]", "fc.weight", "fc.bias"}
    assert min(r.max_abs_err for r in bad.rows) > 100 * max(r.max_abs_err for r in good.rows)


def test_gradcheck_samples_big_tensors_and_says_so():
    report = gradcheck(*load_case("net"), max_entries=16)
    assert report.passed, report.format()
    fc1 = next(r for r in report.rows if r.name == "fc1.weight")
    assert (fc1.checked, fc1.numel) == (16, 128)
    assert report.sampled and "seeded sample" in report.format()


def test_tolerance_follows_the_step():
    small, _ = step_tolerance(1e-6, 10.0)
    big, _ = step_tolerance(1e-3, 10.0)
    tiny, _ = step_tolerance(1e-9, 10.0)
    assert big > small and tiny > small  # truncation grows with eps, roundoff with 1/eps


def test_recorded_grads_are_deterministic_and_cover_inputs_and_params():
    case, inv = load_case("net")
    cot1, g1 = record_grads(case, inv, seed=0)
    cot2, g2 = record_grads(case, inv, seed=0)
    cot3, _ = record_grads(case, inv, seed=1)
    assert torch.equal(cot1[0], cot2[0]) and not torch.equal(cot1[0], cot3[0])
    assert set(g1["inputs"]) == {"args[0]"}
    assert set(g1["params"]) == set(inv.states["a"])  # Net has parameters only, no buffers
    assert all(torch.equal(g1[k][n], g2[k][n]) for k in g1 for n in g1[k])


def test_grads_storable_in_a_golden():
    from opdiff_snap.core.trees import flatten, unflatten
    cot, grads = record_grads(*load_case("cube_good"), seed=0)
    structure, leaves = flatten(RecordedGrads(cot, grads).to_nested())
    back = RecordedGrads.from_nested(unflatten(structure, leaves))
    cot2, grads2 = back.cotangent, back.grads
    assert torch.equal(grads2["params"]["fc.weight"], grads["params"]["fc.weight"])
    assert torch.equal(cot2[0], cot[0])


def test_op_without_float_grad_is_a_clear_error():
    case, inv = load_case("add")
    inv.args = [a.to(torch.int64) for a in inv.args]
    with pytest.raises(OpdiffError, match="grad: true"):
        record_grads(case, inv, seed=0)


@pytest.mark.parametrize("preset", ["torch_cpu_fp32", "torch_cpu_bf16"])
def test_grad_parity_on_torch_presets(preset):
    case, inv = load_case("net")
    cot, grads = record_grads(case, inv, seed=0)
    result = check_grads(case, inv, cot, grads, _preset(preset))
    assert result.verdict is Verdict.PASS, result.message


def test_grad_parity_catches_a_wrong_gradient():
    case, inv = load_case("net")
    cot, grads = record_grads(case, inv, seed=0)
    grads["params"]["fc2.bias"] = grads["params"]["fc2.bias"] * 1.1
    result = check_grads(case, inv, cot, grads, _preset("torch_cpu_bf16"))
    assert result.verdict is Verdict.MISMATCH
    assert "fc2.bias" in result.message


def test_grads_on_a_non_differentiable_preset_are_refused():
    case, inv = load_case("net")
    cot, _ = record_grads(case, inv, seed=0)
    with pytest.raises(OpdiffError, match="cannot differentiate"):
        compute_grads(case, inv, cot, _preset("onnx_cpu_fp32"))


@pytest.mark.slow
def test_grad_parity_on_inductor():
    case, inv = load_case("net")
    cot, grads = record_grads(case, inv, seed=0)
    result = check_grads(case, inv, cot, grads, _preset("inductor_cpu_fp32"))
    assert result.verdict is Verdict.PASS, result.message


def test_gradcheck_runs_in_a_worker_and_a_dying_one_is_a_report_not_a_crash():
    from opdiff_snap.core.verdicts import Verdict as V
    from opdiff_snap.execution.pools import run_one

    case, _ = load_case("cube_bad")
    report = run_one(GradcheckTask(case, 0, 1e-6, 32, key="cube_bad"))
    assert report.error is None and not report.passed      # ran, in a worker, and found the bug
    failed = GradcheckTask(case, 0, 1e-6, 32).failed(V.CRASH, "signal SIGSEGV", "the worker died")
    assert not failed.passed and "CRASH: the worker died" in failed.format()
