"""localize: the first divergent leaf submodule, through the real backend protocol."""

from __future__ import annotations

import pytest
import torch
from helpers.cause import load_case
from helpers.cause.wrong_backend import PerturbingBackend

from opdiff_snap.cause.calls import capture_calls
from opdiff_snap.cause.localize import localize
from opdiff_snap.cause.localize_report import format_report
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict

ORDER = ["fc1", "act", "norm", "scale", "fc2", "act"]


def _preset(name):
    from opdiff_snap.backends.registry import get_preset
    return get_preset(name)


def test_capture_follows_execution_order_and_repeats():
    calls = capture_calls(*load_case("net"))
    root, leaves = calls[0], [c for c in calls if c.info.leaf]
    assert (root.info.name, root.info.leaf, root.info.parent) == ("", False, None)   # the module itself
    assert [c.info.name for c in leaves] == ORDER  # act is called twice: two entries
    assert [c.info.cls for c in leaves][:4] == ["Linear", "Tanh", "LayerNorm", "Scale"]
    assert [c.info.occurrence for c in leaves] == [0, 0, 0, 0, 0, 1] and leaves[-1].info.scope == "act#1"
    assert {c.info.parent for c in leaves} == {0}
    # each call's input is the previous call's output (the chain is really captured)
    assert torch.equal(leaves[1].args[0], leaves[0].output)


def test_perturbed_sublayer_is_named_and_nothing_before_it(tmp_path):
    case, inv = load_case("net")
    report = localize(case, inv, _preset("torch_cpu_fp32"),
                      backend=PerturbingBackend(victim="Scale"))
    statuses = [(r.name, r.status) for r in report.rows]
    assert report.first_divergent is not None and report.first_divergent.name == "scale"
    assert report.divergence == "mismatch"
    assert statuses[:3] == [("fc1", Verdict.PASS), ("act", Verdict.PASS), ("norm", Verdict.PASS)]
    # layers after it get the baseline's inputs, so they reproduce it again
    assert [s for _, s in statuses[4:]] == [Verdict.PASS, Verdict.PASS]
    assert report.first_divergent.metrics["max_abs"] == pytest.approx(1e-2, rel=1e-3)
    assert "first divergent submodule is 'scale'" in format_report(report)


def test_clean_backend_reports_no_divergence(tmp_path):
    case, inv = load_case("net")
    report = localize(case, inv, _preset("torch_cpu_fp32"))
    assert report.first_divergent is None and report.divergence == "none" and report.ops is None
    assert len(report.rows) == 6   # every leaf call was run, not an empty report
    assert all(r.status is Verdict.PASS for r in report.rows)
    # no leaf diverges, so the module itself ran too: it passes, there is nothing to descend into
    assert [(r.label, r.status) for r in report.enclosing] == [("<root>", Verdict.PASS)]


def test_failure_to_run_is_reported_distinctly(tmp_path):
    class Refusing(PerturbingBackend):
        def export(self, module, inputs, preset, workdir):
            if any(isinstance(m, torch.nn.LayerNorm) for m in module.modules()):
                raise RuntimeError("LayerNorm not supported")
            return super().export(module, inputs, preset, workdir)

    case, inv = load_case("net")
    report = localize(case, inv, _preset("torch_cpu_fp32"),
                      backend=Refusing(victim="Scale"))
    assert report.first_divergent.name == "norm"
    assert report.first_divergent.status is Verdict.EXPORT_FAIL and report.divergence == "failed"
    assert "LayerNorm not supported" in report.first_divergent.message


def test_op_tests_are_refused_with_a_clear_error():
    case, inv = load_case("add")
    with pytest.raises(OpdiffError, match="op test"):
        capture_calls(case, inv)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["torch_cpu_fp16", "onnx_cpu_fp32"])
def test_localize_on_real_backends_returns_rows(tmp_path, preset):
    case, inv = load_case("net")
    report = localize(case, inv, _preset(preset))
    assert [r.name for r in report.rows] == ORDER
    assert all(r.status in (Verdict.PASS, Verdict.MISMATCH) for r in report.rows), format_report(report)
    assert all("max_abs" in r.metrics for r in report.rows)
