"""run_job on real backends (torch eager, ONNX Runtime CPU), and the artifact cache."""

import json
import statistics

import pytest
import torch
from helpers.execution.cases import job, module_case, op_case, x

from opdiff_snap.backends.base import Preset
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.cache import cache_key
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.execution.runner import run_job


def test_torch_eager_topk_timings_and_structure():
    a = x(3, 5, seed=1)
    out = run_job(job(op_case("aten::topk"), [a, 2], repeats=4, warmup=2))
    assert out.status is None, out.error_message
    values, indices = restore_outputs(out.output_structure, out.outputs)
    ref = torch.topk(a, 2)
    assert torch.equal(values, ref.values) and torch.equal(indices, ref.indices)
    assert len(out.infer_ms_all) == 4
    assert out.infer_ms == statistics.median(out.infer_ms_all)
    assert out.export_ms is not None and out.load_ms is not None and not out.cache_hit


def test_reduced_precision_outputs_come_back_in_the_eager_dtype():
    a, b = x(4, 4, seed=2), x(4, 4, seed=3)
    out = run_job(job(op_case("aten::mm"), [a, b], preset="torch_cpu_fp16"))
    assert out.status is None, out.error_message
    (t,) = out.outputs
    assert t.dtype == torch.float32
    assert not torch.equal(t, a @ b)               # it really computed in fp16 ...
    torch.testing.assert_close(t, a @ b, atol=1e-2, rtol=1e-2)  # ... and close to fp32


def test_unavailable_preset_says_why():
    out = run_job(job(op_case("aten::relu"), [x(3)], preset="torch_cuda_fp32"))
    assert out.status is Verdict.UNAVAILABLE
    assert "CUDA" in out.error_message


def test_prepare_failure_is_reported_not_raised():
    case = module_case("torch.nn.Linear", 4, 3)
    j = job(case, [x(2, 4)])
    j.invocation.states["a"].pop("bias")
    out = run_job(j)
    assert out.status is Verdict.EXPORT_FAIL
    assert "stored weights do not fit" in out.error_message and "bias" in out.error_message


@pytest.mark.slow
def test_onnx_cpu_ops_modules_and_lists():
    a, b = x(2, 3, seed=4), x(2, 5, seed=5)
    out = run_job(job(op_case("aten::cat"), [[a, b], 1], preset="onnx_cpu_fp32"))
    assert out.status is None, out.error_message
    torch.testing.assert_close(restore_outputs(out.output_structure, out.outputs), torch.cat([a, b], 1))

    case = module_case("torch.nn.Linear", 3, 2)
    j = job(case, [a], preset="onnx_cpu_fp32", repeats=3)
    out = run_job(j)
    assert out.status is None, out.error_message
    w, bias = j.invocation.states["a"]["weight"], j.invocation.states["a"]["bias"]
    torch.testing.assert_close(out.outputs[0], a @ w.T + bias)
    assert len(out.infer_ms_all) == 3


@pytest.mark.slow
def test_onnx_export_failure_is_export_fail():
    case = module_case("file:crashy.py::DataDependent", id="data-dependent")
    out = run_job(job(case, [x(3)], preset="onnx_cpu_fp32"))
    assert out.status is Verdict.EXPORT_FAIL
    assert out.error_class and out.error_message.startswith(out.error_class)


@pytest.mark.slow
def test_cache_hit_skips_export_and_changes_nothing(tmp_path):
    a = x(3, 4, seed=6)
    case = module_case("torch.nn.Linear", 4, 2, id="lin-cache")
    cold = run_job(job(case, [a], preset="onnx_cpu_fp32", cache_dir=tmp_path))
    warm = run_job(job(case, [a], preset="onnx_cpu_fp32", cache_dir=tmp_path))
    uncached = run_job(job(case, [a], preset="onnx_cpu_fp32"))
    assert cold.status is warm.status is uncached.status is None
    assert not cold.cache_hit and warm.cache_hit and not uncached.cache_hit
    assert warm.export_ms < cold.export_ms
    for o in (warm, uncached):
        assert all(torch.equal(p, q) for p, q in zip(cold.outputs, o.outputs))
    entries = [p for p in tmp_path.glob("*/*") if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / "complete").is_file()
    assert json.loads((entries[0] / "entry.json").read_text())["export_ms"] == pytest.approx(cold.export_ms)

    # another seed's weights are another artifact
    assert cache_key(job(case, [a], preset="onnx_cpu_fp32", seed=1)) != entries[0].name
    # an incomplete entry is ignored and rebuilt
    (entries[0] / "complete").unlink()
    rebuilt = run_job(job(case, [a], preset="onnx_cpu_fp32", cache_dir=tmp_path))
    assert rebuilt.status is None and not rebuilt.cache_hit
    assert (entries[0] / "complete").is_file()
    # a corrupt artifact (complete marker, garbage model) is evicted and rebuilt
    for f in (entries[0] / "work").glob("*.onnx"):
        f.write_bytes(b"not a model")
    again = run_job(job(case, [a], preset="onnx_cpu_fp32", cache_dir=tmp_path))
    assert again.status is None and not again.cache_hit
    assert all(torch.equal(p, q) for p, q in zip(cold.outputs, again.outputs))


def test_non_serializing_backends_do_not_cache(tmp_path):
    out = run_job(job(op_case("aten::relu"), [x(3)], cache_dir=tmp_path))
    assert out.status is None and not out.cache_hit
    assert not any(tmp_path.iterdir())


def test_cache_key_follows_preset_options():
    case = op_case("aten::relu")
    j1 = job(case, [x(3)], preset="onnx_cpu_fp32")
    j2 = job(case, [x(3)], preset=Preset("onnx_cpu_fp32", "onnx", "cpu", "fp32",
                                         {**j1.preset.options, "opset": 18}))
    assert cache_key(j1) != cache_key(j2)
    assert cache_key(j1) == cache_key(job(case, [x(3, seed=9)], preset="onnx_cpu_fp32"))
