"""Check's verdict of one finished job: the backend's failure, or the comparison of its
outputs with the golden (compare/numerics.py), with the rounding the golden measured.

A MISMATCH on fp16/bf16 is also judged against torch eager at the same precision (the
precision control): when torch fails the same comparison, the result is
precision-limited.

Pair tests: the target runs both sides on the same inputs, and each side is compared
with its own side of the golden: PASS means a matches golden a and b matches golden b.
How far b is from a on the target is a metric (`b_vs_a`), not the verdict; the message
names the side that drifted, and says so when the golden's sides agree but the
target's do not.

Gradients: for a `grad: true` test whose golden holds gradients, on a preset whose
backend can differentiate, the worker recomputes the recorded vector-Jacobian product
after the forward pass, and judge compares it. A gradient mismatch makes the item
MISMATCH with a message that says so; its metrics go under `metrics.grad`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..backends.base import Delegation, Preset
from ..compare.gradient_match import compare_grads
from ..compare.int8_errors import judge_int8, sqnr_db
from ..compare.metrics import Control, Judged, Metrics
from ..compare.numerics import Comparison, compare
from ..compare.results import Result
from ..compare.rounding import rounding_for
from ..compare.rules import Rounding
from ..compare.vacuous import op_of, vacuous_reason
from ..core.verdicts import Verdict
from ..execution.job import Outcome
from ..execution.outputs import flat_values, restore_outputs
from ..execution.references import REDUCED, needs_control
from ..goldens import Golden
from ..suite.model import RecordedGrads, TestCase, Tolerance
from .check_plan import Planned


@dataclass
class Pending:
    """What judging one job's outcome needs: the planned item, its golden, the preset and
    the tolerance it is judged with."""

    item: Planned
    golden: Golden
    preset: Preset
    tol: Tolerance
    require_delegated: bool = False   # a fallback off the delegate fails the result


def judge(pending: Pending, outcome: Outcome) -> Result:
    """The Result of one finished job: the backend's failure, or the comparison with the
    golden (each side of a pair with its own golden side)."""
    item, golden, preset, tol = pending.item, pending.golden, pending.preset, pending.tol
    case = item.case
    result = Result.of(case, item.test_id, item.seed, preset.name, Verdict.PASS, tolerance=tol,
                       baseline=item.baseline).with_outcome(outcome)
    if outcome.status is not None:
        result.verdict = outcome.status
        if outcome.status is Verdict.UNAVAILABLE and outcome.control is not None:
            result.message = f"{result.message}{judged_there(golden, preset, tol, outcome)}"
        if outcome.status is Verdict.UNAVAILABLE and outcome.quantized is not None:
            _quantization_only(result, golden, outcome, tol)
        return result
    result.vacuous = vacuous_reason(golden.outputs, tol, op_of(case) if case is not None else None)
    actual = restore_outputs(outcome.output_structure, outcome.outputs or [])
    rounding = rounding_for(golden, preset, outcome.output_structure, outcome.elementwise,
                            control_of(outcome, preset))
    cmp = compare(golden.outputs, actual, tol, rounding=rounding)
    result.verdict, result.message = cmp.verdict, cmp.message
    result.metrics = dataclasses.replace(cmp.metrics) if cmp.metrics is not None else None
    if outcome.quantized is not None:
        if cmp.verdict in (Verdict.PASS, Verdict.MISMATCH):   # the same shapes and dtypes: judged as int8
            _judge_int8(result, golden, outcome, tol, preset)
    elif cmp.verdict is Verdict.MISMATCH or (cmp.metrics is not None and cmp.metrics.as_torch):
        _control(result, golden, outcome, tol, dataclasses.replace(rounding, control=None), cmp, preset)
    if case is not None and case.pair is not None and outcome.quantized is None:
        _judge_pair(result, case, golden, actual, tol, cmp)
    if result.verdict is Verdict.PASS:
        _check_grads(result, pending, outcome)
    if result.verdict is Verdict.PASS and (pending.require_delegated or preset.options.get("require_delegated")):
        if result.delegation is not None and result.delegation.fallback:
            result.verdict, result.message = Verdict.NOT_DELEGATED, not_delegated_message(result.delegation)
        elif result.delegation is None and outcome.delegation_error is not None:
            result.verdict = Verdict.NOT_DELEGATED
            result.message = (f"it matched, but the evidence of what the delegate took could not be read "
                              f"({outcome.delegation_error}), even from a fresh export; nothing shows that "
                              "every op node is on the delegate.")
    return result


def _judge_int8(result: Result, golden: Golden, outcome: Outcome, tol: Tolerance, preset: Preset) -> None:
    """An int8 result: its lowering error against the quantized reference decides MISMATCH,
    its quantization error against the golden SQNR_LOW where a minimum is set
    (compare/int8_errors.py); the comparison with the golden stays in the metrics."""
    q = outcome.quantized
    assert q is not None and outcome.outputs is not None
    judged = judge_int8(flat_values(golden.outputs), outcome.outputs, q.reference, q.scales, tol, preset.precision)
    metrics = _beside(result)
    metrics.quant_sqnr, metrics.lowering_sqnr = judged.sqnr, judged.lowering_sqnr
    metrics.lowering_steps, metrics.lowering_bias = judged.lowering_steps, judged.lowering_bias
    metrics.quant_step, metrics.quant_failed = judged.step, judged.failed
    result.verdict = judged.verdict
    sqnr = "n/a" if judged.sqnr is None else f"{judged.sqnr:.3g} dB"
    if judged.verdict is Verdict.MISMATCH:
        result.message = f"{judged.message}. Quantization error (reference against the golden): SQNR {sqnr}."
    elif judged.verdict is Verdict.PASS:
        result.message = ""
    else:
        result.message = judged.message + "."


def _quantization_only(result: Result, golden: Golden, outcome: Outcome, tol: Tolerance) -> None:
    """An int8 result converted but not run here: its quantization error is still measured
    (the quantized reference ran in the worker), and is SQNR_LOW below a `min_sqnr` set."""
    q = outcome.quantized
    assert q is not None
    expected = flat_values(golden.outputs)
    if len(expected) != len(q.reference) or any(e.shape != r.shape for e, r in zip(expected, q.reference)):
        return
    sqnr = sqnr_db(expected, q.reference)
    metrics = _beside(result)
    metrics.quant_sqnr = sqnr
    if sqnr is None:
        return
    result.message = f"{result.message}; the quantized model is {sqnr:.3g} dB SQNR from the golden"
    if tol.min_sqnr is not None and sqnr < tol.min_sqnr:
        metrics.quant_failed = "quantization"
        result.verdict = Verdict.SQNR_LOW
        result.message = (f"quantization error: the quantized model (before lowering) is {sqnr:.3g} dB SQNR from "
                          f"the fp32 golden, below the {tol.min_sqnr:g} dB asked (the backend converted it; it "
                          "cannot run here).")


def judged_there(golden: Golden, preset: Preset, tol: Tolerance, outcome: Outcome) -> str:
    """For a result exported here and run elsewhere (CoreML on Linux): what its composite
    fp16/bf16 outputs will be held to, from the precision control computed here."""
    from ..compare.leaf_verdict import leaf_rules

    try:   # the control's outputs must fit the golden's; a note that cannot be made is left out
        rounding = rounding_for(golden, preset, outcome.output_structure, None, outcome.control)
        own = [rule.torch for rule in leaf_rules(golden.outputs, tol, rounding)
               if rule is not None and rule.torch is not None]
    except (ValueError, TypeError, RuntimeError, IndexError, KeyError):
        return ""
    if not own:
        return ""
    worst = max(own, key=lambda t: t.largest)
    return (f". Where it runs, its composite outputs will be held to {worst.factor:g}x torch eager's own "
            f"{preset.precision} error (here: RMS {max(t.rms for t in own):.3g}, largest {worst.largest:.3g} "
            "against the golden's float64 reference), besides the tolerance")


def control_of(outcome: Outcome, preset: Preset) -> list | None:
    """Torch eager's outputs at the target's precision (flat): the worker's precision
    control, or on torch eager on the CPU the target's own outputs, which are that."""
    if preset.precision not in REDUCED:
        return None
    if needs_control(preset):
        return outcome.control
    return outcome.outputs


def _beside(result: Result) -> Metrics:
    """The result's metrics, to keep another measurement beside its comparison's numbers
    (a result whose outputs could not be compared gets metrics of that alone)."""
    if result.metrics is None:
        result.metrics = Metrics(compared=False)
    return result.metrics


def _control(result: Result, golden: Golden, outcome: Outcome, tol: Tolerance, rounding: Rounding,
             cmp: Comparison, preset: Preset) -> None:
    """A MISMATCH on fp16/bf16, or a PASS as good as torch's own at that precision: judge
    torch eager at the same precision the same way (by the golden's tolerance and rounding,
    `rounding` holding no control). When it fails too, by at least half as much, the result
    is precision-limited: the loss is the precision's, and the backend is not where to look
    first. On torch eager on the CPU the target's own outputs are that control."""
    own = control_of(outcome, preset)
    if own is None:
        if outcome.control_note:
            result.message += f" (torch eager gives no {rounding.target_precision} control to judge it against, " \
                              f"so the tolerance alone judges it: {outcome.control_note})"
        return
    control = compare(golden.outputs, restore_outputs(outcome.output_structure, own), tol, rounding=rounding)
    target_abs = cmp.metrics.max_abs if cmp.metrics is not None else 0.0
    control_abs = control.metrics.max_abs if control.metrics is not None else 0.0
    result.precision_limited = control.verdict is Verdict.MISMATCH and control_abs >= 0.5 * target_abs
    _beside(result).control = Control(control.verdict.value, control_abs,
                                      control.metrics.failed_bound if control.metrics is not None else None)
    m = cmp.metrics
    if cmp.verdict is Verdict.PASS and m is not None and m.torch_multiple is not None:
        shared = "; torch eager itself fails the golden's tolerance there" if result.precision_limited else ""
        result.message = (f"as good as torch's own {rounding.target_precision}: {m.as_torch} elements lie "
                          f"outside the tolerance, and the error is {m.torch_multiple:.3g}x torch eager's own "
                          f"in {rounding.target_precision} (at most {m.torch_factor:g}x allowed){shared}")
    elif result.precision_limited:
        result.message = (f"precision-limited: torch eager in {rounding.target_precision} on the same inputs "
                          f"fails the same comparison (max_abs {control_abs:.3g} against this backend's "
                          f"{target_abs:.3g}); look at the precision before the backend. " + result.message)


def not_delegated_message(d: Delegation) -> str:
    ops = "; ".join(f"{o.op} x{o.fallback}" + (f" ({o.sources[0]})" if o.sources else "") for o in d.fallback_ops())
    return (f"{d.fallback} of {d.fallback + d.delegated} op nodes stayed off the {d.delegate} delegate, and "
            f"every one must be on it (--require-delegated): {ops}. The outputs match the golden.")


def _judge_pair(result: Result, case: TestCase, golden: Golden, actual: Any, tol: Tolerance,
                cmp: Comparison) -> None:
    """Name the side that drifted, and keep b vs a on the target in the metrics."""
    on_target = compare(actual["a"], actual["b"], tol, root="b_vs_a")
    _beside(result).b_vs_a = Judged(on_target.verdict.value, on_target.metrics)
    if cmp.passed:
        return
    impls = {"a": case.call.impl, "b": case.pair.impl if case.pair else None}
    drifted = [side for side in ("a", "b") if any(p.startswith(f"out[{side!r}]") for p in cmp.failing)]
    named = " and ".join(f"side {side}" + (f" ({impls[side]})" if impls[side] else "") for side in drifted)
    verb, whose = ("drift", "their") if len(drifted) > 1 else ("drifts", "its")
    notes = [f"{named} {verb} from {whose} golden"] if drifted else []
    if not on_target.passed and compare(golden.outputs["a"], golden.outputs["b"], tol).passed:
        max_abs = on_target.metrics.max_abs if on_target.metrics else float("nan")
        notes.append(f"the golden's sides agree but on {result.preset} they do not (b vs a: "
                     f"{on_target.verdict.value}, max_abs={max_abs:.3g})")
    if notes:
        result.message = "; ".join(notes) + ": " + result.message


def _check_grads(result: Result, pending: Pending, outcome: Outcome) -> None:
    """Gradient parity: the worker recomputed the recorded vector-Jacobian product on the
    target (see check_job.grad_request); compare it with the golden's."""
    if outcome.grads_error is not None:
        result.verdict, result.error_class = Verdict.INFER_FAIL, "GradientError"
        result.message = f"the forward pass matched; computing the gradients failed: {outcome.grads_error}"
        return
    if outcome.grads is None or isinstance(outcome.grads, RecordedGrads) or pending.golden.grads is None:
        return  # not asked: no gradients recorded, or the preset cannot differentiate
    cmp = compare_grads(pending.golden.grads.grads, outcome.grads, pending.tol)
    _beside(result).grad = Judged(cmp.verdict.value, cmp.metrics)
    if cmp.verdict is not Verdict.PASS:
        result.verdict = Verdict.MISMATCH
        result.message = (f"the forward pass matched, the gradient does not ({cmp.verdict.value}): "
                          f"{cmp.message}")
