"""int8 presets: the lowering error (the backend against the quantized reference) and the
quantization error (the reference against the golden) measured apart, with calibration
drawn from each test's input spec as data. Real ExecuTorch (XNNPACK) and ONNX Runtime on
goldens recorded here; a planted ExecuTorch backend whose one kernel adds a step
(helpers/numerics/planted_int8.py)."""

from __future__ import annotations

import contextlib
import math
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers.check import make_site, plugin_installed
from helpers.numerics import x86_int8_saturates
from helpers.numerics.planted_int8 import ENTRY_POINTS, PRESET

from opdiff_snap import api
from opdiff_snap.analytics.reports import diff_runs
from opdiff_snap.backends.family_common import IS_MACOS
from opdiff_snap.compare.int8_errors import BIAS_STEPS, judge_int8, sqnr_db
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.int8_reference import calibration_inputs, digest
from opdiff_snap.goldens import GoldenStore
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.model import Tolerance

HERE = Path(__file__).resolve().parent / "helpers" / "numerics"
INT8 = ["executorch_cpu_int8", "onnx_cpu_int8", "inductor_cpu_int8"]
# ONNX Runtime's and inductor's int8 kernels saturate on x86 without VNNI: their lowering
# error is real there and larger than a step or two (tests/helpers/numerics: x86_int8_saturates)
SATURATES = x86_int8_saturates()
X86_KERNELS = ("onnx_cpu_int8", "inductor_cpu_int8")


# ---------------------------------------------------------------- judging, on numbers

def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_lowering_error_is_counted_in_steps_of_each_outputs_scale():
    golden = [torch.linspace(0, 3, 16)]
    reference = [golden[0] + 0.1 * (torch.arange(16) % 2)]
    one, three = reference[0].clone(), reference[0].clone()
    one[3] += 0.1
    three[5] -= 0.3
    within = judge_int8(golden, [one], reference, [0.1], Tolerance(), "int8")
    assert within.verdict is Verdict.PASS and within.lowering_steps == pytest.approx(1.0, rel=1e-4)
    beyond = judge_int8(golden, [three], reference, [0.1], Tolerance(), "int8")
    assert beyond.verdict is Verdict.MISMATCH and beyond.failed == "lowering"
    assert "up to 3 quantization steps" in beyond.message
    # the same error is within a tolerance of 3 steps set for the test
    assert judge_int8(golden, [three], reference, [0.1], Tolerance(steps=3), "int8").verdict is Verdict.PASS
    # no dequantize scale (dynamic activations): one step of max|reference| / 127
    step = float(reference[0].abs().max()) / 127
    dynamic = judge_int8(golden, [reference[0] + step * (torch.arange(16) == 0)], reference, [None], Tolerance(),
                         "int8dyn")
    assert dynamic.lowering_steps == pytest.approx(1.0, rel=1e-4) and dynamic.step == pytest.approx(step)


def test_a_shift_every_element_shares_fails_below_the_largest_error_tolerance():
    reference = [torch.linspace(-1, 1, 64)]
    shifted = [reference[0] + 0.01]            # one step everywhere: within 2 steps, but a bias
    judged = judge_int8(reference, shifted, reference, [0.01], Tolerance(), "int8")
    assert judged.lowering_steps == pytest.approx(1.0, rel=1e-3) and judged.lowering_bias > BIAS_STEPS
    assert judged.verdict is Verdict.MISMATCH and "mean signed error" in judged.message


def test_quantization_error_is_sqnr_and_a_verdict_only_when_a_minimum_is_set():
    golden = [torch.linspace(-1, 1, 64)]
    reference = [golden[0] + 0.05 * torch.sin(torch.arange(64.0))]
    expected = sqnr_db(golden, reference)
    assert expected is not None and 10 < expected < 40
    plain = judge_int8(golden, reference, reference, [0.01], Tolerance(), "int8")
    assert plain.verdict is Verdict.PASS and plain.sqnr == pytest.approx(expected)
    strict = judge_int8(golden, reference, reference, [0.01], Tolerance(min_sqnr=expected + 1), "int8")
    assert strict.verdict is Verdict.SQNR_LOW and strict.failed == "quantization"
    assert sqnr_db(golden, golden) == math.inf


def test_a_reference_of_another_structure_is_a_structure_or_shape_mismatch():
    ref = [torch.zeros(2, 3)]
    assert judge_int8(ref, [torch.zeros(2, 3), torch.zeros(1)], ref, [0.1], Tolerance(), "int8").verdict \
        is Verdict.STRUCTURE_MISMATCH
    assert judge_int8(ref, [torch.zeros(3, 2)], ref, [0.1], Tolerance(), "int8").verdict is Verdict.SHAPE_MISMATCH


def test_integer_outputs_must_equal_the_quantized_reference():
    ref = [torch.tensor([1, 2, 3])]
    assert judge_int8(ref, [torch.tensor([1, 2, 3])], ref, [None], Tolerance(), "int8").verdict is Verdict.PASS
    off = judge_int8(ref, [torch.tensor([1, 2, 4])], ref, [None], Tolerance(), "int8")
    assert off.verdict is Verdict.MISMATCH and "1 of 3 elements" in off.message


# ---------------------------------------------------------------- calibration is data

CALIBRATION = """
import sys
from pathlib import Path
from opdiff_snap.execution.int8_reference import calibration_inputs, digest
from opdiff_snap.goldens import GoldenStore
from opdiff_snap.suite import load_suites
root = Path(sys.argv[1])
case = next(c for c in load_suites([root / "suites" / "int8.yaml"]) if c.id == "qconv")
print(digest(calibration_inputs(case, GoldenStore(root / "goldens").read("qconv", 0).invocation, 0, 8)))
"""


def test_calibration_is_drawn_from_the_spec_bit_for_bit_anywhere(recorded):
    case = next(c for c in load_suites([recorded / "suites" / "int8.yaml"]) if c.id == "qconv")
    golden = GoldenStore(recorded / "goldens").read("qconv", 0)
    samples = calibration_inputs(case, golden.invocation, 0, 8)
    assert len(samples) == 8 and all(s[0].shape == (2, 3, 8, 8) for s in samples)
    assert not torch.equal(samples[0][0], golden.invocation.args[0])      # a stream apart from the golden's
    assert not torch.equal(samples[0][0], samples[1][0])
    again = subprocess.run([sys.executable, "-c", CALIBRATION, str(recorded)], capture_output=True, text=True,
                           check=True)
    assert again.stdout.strip() == digest(samples)                       # another process draws the same bytes
    assert digest(calibration_inputs(case, golden.invocation, 1, 8)) != digest(samples)


# ---------------------------------------------------------------- real backends

def _settings(**kw) -> Settings:
    return Settings(suites=Path("suites"), repeats=1, warmup=0, jobs=1, **kw)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("int8")
    (root / "suites").mkdir()
    for name in ("int8.yaml", "mods.py"):
        shutil.copy(HERE / name, root / "suites" / name)
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=_settings())
    assert {r.verdict for r in report.results} == {Verdict.RECORDED}
    return root


def _check(root: Path, backends: list[str], test_ids=None, **request):
    with contextlib.chdir(root):
        return api.check(api.CheckRequest(backends, api.Selection(test_ids=test_ids), api.Running(in_process=True),
                                          **request), settings=_settings())


@pytest.fixture(scope="module")
def checked(recorded):
    first = _check(recorded, INT8)
    again = _check(recorded, INT8)
    return first, again


@pytest.mark.slow
def test_int8_presets_pass_with_both_errors_measured(checked):
    first, _ = checked
    by = {(r.test_id, r.preset): r for r in first.results}
    assert len(by) == 9
    for (test_id, preset), r in by.items():
        m = r.metrics
        assert m.lowering_steps is not None, (test_id, preset)
        if SATURATES and preset in X86_KERNELS:
            assert r.verdict is Verdict.PASS or r.message.startswith("lowering error"), (test_id, preset, r.message)
        else:
            assert r.verdict is Verdict.PASS, (test_id, preset, r.message)
            assert m.lowering_steps <= 2.001, (test_id, preset)
        assert r.calibration and len(r.calibration) == 16
    for preset in INT8:     # a quantized model is further from the golden than its lowering from it
        m = by[("qmlp", preset)].metrics
        assert 20 < m.quant_sqnr < 60 and m.quant_step > 0
    # sin is quantized by neither quantizer: its reference is the float op
    assert by[("qsin", "executorch_cpu_int8")].metrics.quant_sqnr > 100


@pytest.mark.slow
def test_a_second_run_quantizes_from_the_same_data_and_keeps_its_verdicts(checked):
    first, again = checked
    one = {(r.test_id, r.preset): r for r in first.results}
    two = {(r.test_id, r.preset): r for r in again.results}
    for key, r in one.items():
        assert two[key].cache_hit or key[1].startswith("inductor"), key   # inductor keeps nothing on disk
        assert (two[key].verdict, two[key].calibration) == (r.verdict, r.calibration), key
        assert two[key].metrics.quant_sqnr == r.metrics.quant_sqnr, key


@pytest.mark.slow
def test_a_check_from_goldens_copied_to_another_project_gives_the_same_results(recorded, checked, tmp_path):
    first, _ = checked
    other = tmp_path / "elsewhere"
    shutil.copytree(recorded / "suites", other / "suites")
    shutil.copytree(recorded / "goldens", other / "goldens")
    elsewhere = {(r.test_id, r.preset): r for r in _check(other, INT8).results}
    for r in first.results:
        e = elsewhere[(r.test_id, r.preset)]
        assert not e.cache_hit
        assert (e.verdict, e.calibration, e.metrics.quant_sqnr) == (r.verdict, r.calibration, r.metrics.quant_sqnr)


@pytest.mark.slow
def test_a_planted_step_in_one_kernel_is_a_lowering_error_where_it_reaches(recorded, tmp_path):
    site = make_site(tmp_path / "site", ENTRY_POINTS, "opdiff-int8-test")
    with plugin_installed(site):
        by = {r.test_id: r for r in _check(recorded, [PRESET]).results}
    for test_id in ("qmlp", "qconv"):          # each has a linear layer
        r = by[test_id]
        assert r.verdict is Verdict.MISMATCH and r.metrics.quant_failed == "lowering", (test_id, r.message)
        assert r.message.startswith("lowering error")
    assert by["qsin"].verdict is Verdict.PASS


@pytest.mark.slow
def test_a_quantizer_change_under_the_same_preset_is_a_quantization_error_change(recorded, tmp_path):
    site = make_site(tmp_path / "site", ENTRY_POINTS, "opdiff-int8-test")
    with plugin_installed(site):
        before = _check(recorded, [PRESET], preset_options={PRESET: {"plant": "none"}}, test_ids=["qmlp", "qsin"])
        after = _check(recorded, [PRESET], preset_options={PRESET: {"plant": "coarse_weights"}},
                       test_ids=["qmlp", "qsin"])
    with contextlib.chdir(recorded):
        diff = diff_runs(_settings().store, before.run_id, after.run_id)
    rows = {r[0]: dict(zip(diff.quantization.columns, r)) for r in diff.quantization.rows}
    mlp = rows["qmlp"]                        # 4-bit weights: the quantized model lost precision
    assert mlp["change"] == "quantization error", rows
    assert mlp["quant_sqnr_b"] < mlp["quant_sqnr_a"] - 6 and not mlp["calibration_changed"]
    assert "qsin" not in rows                 # nothing of it is quantized
    assert not diff.newly_failing.rows        # the backend still computes what the quantizer defined


def test_the_quantized_graph_is_read_as_points_static_and_dynamic():
    from helpers.numerics.mods import QuantConv, QuantMLP

    from opdiff_snap.backends.int8_quantizers import pt2e_quantize, xnnpack_quantizer
    from opdiff_snap.cause.quantized_graph import cut_at, points_of

    torch.manual_seed(0)
    img, x = torch.randn(2, 3, 8, 8), torch.randn(8, 32)
    conv = QuantConv().eval()
    static, quantized = pt2e_quantize(conv, (img,), [(torch.randn(2, 3, 8, 8),)], xnnpack_quantizer(True, False), {})
    points = points_of(static)
    # each quantized activation, with the ops since the one before and its fixed scale
    assert [p.ops for p in points] == [["conv2d", "relu"], ["flatten.using_ints"], ["linear"]]
    assert all(p.scale and p.scale > 0 for p in points) and points[0].module.startswith("conv")
    assert "mods.py:" in points[0].source and "self.conv" in points[0].source
    # cut after a point, the graph computes the whole graph's value there; the last is the output
    with torch.no_grad():
        assert torch.equal(cut_at(static, points[-1].node)(img)[0], quantized.reference[0])
        first = cut_at(static, points[0].node)(img)[0]
    assert first.shape == (2, 8, 6, 6) and bool((first >= 0).all())
    # a value several ops take is one point (PT2E gives each user a dequantize of its own)
    class Fan(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)

        def forward(self, t):
            h = torch.relu(self.fc1(t))
            return self.fc2(h) + self.fc3(h)

    fanned, _ = pt2e_quantize(Fan().eval(), (x,), [(x,)], xnnpack_quantizer(True, False), {})
    relu_out = [n for n in fanned.graph.nodes if "dequantize_per_tensor" in str(n.target)
                and n.args[0].args[0].target is torch.ops.aten.relu.default]
    assert len(relu_out) == 2                                     # one dequantize per user ...
    assert [p.ops for p in points_of(fanned)].count(["linear", "relu"]) == 1   # ... one point
    # dynamic activations: the scale is computed as the model runs, so the points are the ops
    # that take the quantized values (their float outputs), with no fixed scale
    dynamic, _ = pt2e_quantize(QuantMLP().eval(), (x,), [(x,)], xnnpack_quantizer(True, True), {})
    points = points_of(dynamic)
    assert [p.ops[-1] for p in points] == ["linear", "linear"] and [p.scale for p in points] == [None, None]
    assert [p.module.split(" ")[0] for p in points] == ["fc1", "fc2"]


@pytest.mark.slow
def test_localize_on_int8_finds_the_first_quantized_point_beyond_its_steps(recorded, tmp_path):
    from click.testing import CliRunner

    from opdiff_snap.cli import main

    site = make_site(tmp_path / "site", ENTRY_POINTS, "opdiff-int8-test")
    with plugin_installed(site), contextlib.chdir(recorded):
        planted = api.localize("qmlp", PRESET, settings=_settings(), in_process=True)
    q = planted.quantized
    assert planted.found and q is not None and q.finding == 1, planted.summary()
    # the plant is in the first linear a quantize follows directly: fc2 (fc1's output goes through relu)
    point = q.points[1]
    assert point.ops == ["linear"] and point.module.startswith("fc2") and point.scale
    assert "mods.py:" in point.source and "self.fc2" in point.source
    assert [q.results[i].status for i in (0, 1)] == [Verdict.PASS, Verdict.MISMATCH]
    assert "point 1 of 2" in planted.summary() and "fc2" in planted.summary()
    with contextlib.chdir(recorded):
        clean = api.localize("qmlp", "executorch_cpu_int8", settings=_settings(), in_process=True)
    assert clean.quantized is not None and not clean.found
    assert [r.status for r in clean.quantized.results.values()] == [Verdict.PASS, Verdict.PASS]
    # ONNX Runtime's quantized model is an ONNX graph, not a torch one: said, exit 2
    result = CliRunner().invoke(main, ["--goldens", str(recorded / "goldens"), "--suites", str(recorded / "suites"),
                                       "localize", "qmlp", "-b", "onnx_cpu_int8"])
    assert result.exit_code == 2 and "onnx_cpu_int8" in result.output and "torch graph" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_coreml_int8_converts_int8_weights_and_quantized_activations(recorded, tmp_path):
    import coremltools as ct

    from opdiff_snap.backends.coreml import PACKAGE_NAME, CoreMLBackend
    from opdiff_snap.backends.registry import get_preset
    from opdiff_snap.execution.prepare import flat_module

    results = _check(recorded, ["coreml_any_int8", "coreml_any_int8pt"]).results
    case = next(c for c in load_suites([recorded / "suites" / "int8.yaml"]) if c.id == "qconv")
    golden = GoldenStore(recorded / "goldens").read("qconv", 0)
    drawn = digest(calibration_inputs(case, golden.invocation, 0, 8))
    for r in results:
        assert r.verdict is (Verdict.PASS if IS_MACOS else Verdict.UNAVAILABLE), (r.test_id, r.preset, r.message)
        assert r.metrics is not None and r.metrics.quant_sqnr is not None   # measured in torch, run or not
        if r.test_id == "qconv":       # quantized from the same data as every other family
            assert r.calibration == drawn and 20 < r.metrics.quant_sqnr < 60
    # so the quantization error is a verdict here too, where a minimum is set
    strict = _check(recorded, ["coreml_any_int8"], test_ids=["qconv"],
                    preset_options={"coreml_any_int8": {"min_sqnr": 100}}).results
    assert [r.verdict for r in strict] == [Verdict.SQNR_LOW] and "100 dB" in strict[0].message
    # what was converted holds int8 weights and CoreML's own activation quantize/dequantize
    prepared = flat_module(case, golden.invocation)
    inputs = tuple(prepared.fresh_inputs())
    artifact, quantized = CoreMLBackend().export_quantized(prepared.module, inputs, calibration_inputs(
        case, golden.invocation, 0, 8), get_preset("coreml_any_int8"), tmp_path)
    spec = ct.models.MLModel(str(tmp_path / PACKAGE_NAME), skip_model_load=True).get_spec()
    ops = Counter(op.type for fn in spec.mlProgram.functions.values()
                  for block in fn.block_specializations.values() for op in block.operations)
    weights = sum(n for op, n in ops.items() if op in ("constexpr_affine_dequantize", "constexpr_blockwise_shift_scale"))
    assert weights == 2 and ops["quantize"] >= 2 and ops["dequantize"] >= 2, ops   # by deployment target
    assert isinstance(golden.outputs, torch.Tensor) and quantized.scales[0]
    assert 20 < sqnr_db([golden.outputs], quantized.reference) < 60


# ---------------------------------------------------------------- bad input

def test_int8_names_and_options_are_checked_before_anything_runs(tmp_path):
    from click.testing import CliRunner

    from opdiff_snap.backends.registry import get_preset
    from opdiff_snap.cli import main
    from opdiff_snap.core.errors import OpdiffError

    with pytest.raises(OpdiffError, match="calibration_samples"):
        get_preset("executorch_cpu_int8", {"calibration_samples": 0})
    result = CliRunner().invoke(main, ["--goldens", str(tmp_path), "check", "-b", "executorch_mps_int8"])
    assert result.exit_code == 2 and "executorch_mps_int8" in result.output
    assert "Traceback" not in result.output
    # a negative step tolerance in a suite is the suite's problem, named with its file
    (tmp_path / "bad.yaml").write_text("tests:\n  - {id: s, op: aten::sin.default, in: [{type: tensor, shape: [2]}],"
                                       " tolerance: {int8: {steps: -1}}}\n")
    result = CliRunner().invoke(main, ["list-tests", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 2 and "bad.yaml" in result.output and "steps" in result.output


# ---------------------------------------------------------------- across versions, in the history

def test_regressions_follow_the_quantization_and_the_lowering_error_apart(tmp_path):
    from helpers.history.synth import Res, Run, write_run

    from opdiff_snap.analytics import connect
    from opdiff_snap.analytics.steps import detect

    preset = "executorch_cpu_int8"
    for i in range(6):
        newer = i >= 3                      # torchao (the quantizer) and executorch both move at run 3
        env = {"torchao": "0.19.0" if newer else "0.18.0", "executorch": "1.6.0" if newer else "1.5.1"}
        results = [Res("quantizer_moved", preset, max_abs=0.05, quant=(28.0 if newer else 35.0, 1.0)),
                   Res("lowering_moved", preset, max_abs=0.05, quant=(35.0, 4.0 if newer else 1.0)),
                   Res("steady", preset, max_abs=0.05, quant=(35.2 if newer else 35.0, 1.0))]
        write_run(tmp_path, Run(f"2026010{i}T000000Z-00000{i}", f"2026-01-0{i + 1}T00:00:00Z", results, env))
    with connect(tmp_path) as a:
        found = detect(a)
    kinds = {(f.test_id, f.kind, f.direction) for f in found}
    assert ("quantizer_moved", "quantization", "regression") in kinds
    assert ("lowering_moved", "lowering", "regression") in kinds
    assert not {k for k in kinds if k[0] == "quantizer_moved" and k[1] == "lowering"}
    assert not {k for k in kinds if k[0] == "lowering_moved" and k[1] == "quantization"}
    assert not {k for k in kinds if k[0] == "steady"}


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()),
    lambda: torch.nn.Sequential(torch.nn.ConvTranspose1d(3, 4, 3), torch.nn.BatchNorm1d(4)),
], ids=["conv2d_bn_relu", "conv_transpose1d_bn"])
def test_the_quantizer_without_its_training_only_patterns_quantizes_the_same(make):
    """The int8 presets' XNNPACK quantizer leaves out the conv-batchnorm patterns XNNPACK
    declares for quantization-aware training: on the inference graphs check quantizes (batch
    norm with running statistics), the converted graph and its outputs are those of the
    quantizer with them."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from opdiff_snap.backends.family_common import export_program
    from opdiff_snap.backends.int8_quantizers import xnnpack_quantizer

    torch.manual_seed(0)
    module = make().eval()
    with torch.no_grad():
        for bn in (m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    x = (torch.randn(2, 3, 8, 8) if isinstance(module[0], torch.nn.Conv2d) else torch.randn(2, 3, 8),)

    def converted(quantizer):
        prepared = prepare_pt2e(export_program(module, x, {}, always_decompose=False).module(), quantizer)
        prepared(*x)
        out = convert_pt2e(prepared)
        return str(out.graph), out(*x)

    ours = xnnpack_quantizer(per_channel=True, dynamic=False)
    assert not any(p.is_qat for p in ours.SUPPORTED_PATTERNS)
    stock = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    (graph, y), (stock_graph, stock_y) = converted(ours), converted(stock)
    assert "quantize_per_tensor" in graph and graph == stock_graph and torch.equal(y, stock_y)
