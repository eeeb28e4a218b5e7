"""Every family on its real runtime: export -> load -> run flat modules, compare with eager.

Two flat modules cover the protocol's cases: `Ops` (multiple outputs from aten.topk and
aten.max.dim, an int64 input and an int64 output, a list-of-tensors op `cat` over two
inputs) and `Net` (Conv2d + Linear with weights). Exports are shared per preset through a
module-scoped cache. Presets that cannot run here are skipped with availability's reason.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from opdiff_snap.backends.base import Artifact
from opdiff_snap.backends.registry import availability, backend_for, get_preset


class Ops(torch.nn.Module):
    def forward(self, x, idx, a, b):
        values, indices = torch.ops.aten.topk(x, 3)
        mx, argmx = torch.ops.aten.max.dim(x, 1)
        return values, indices, mx, argmx, torch.index_select(x, 0, idx), idx * 2, torch.cat([a, b], 0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return (self.fc(torch.relu(self.conv(x)).flatten(1)),)


def _cases():
    gen = torch.Generator().manual_seed(0)
    # distinct values on a 0.25 grid: exact in fp16/bf16, no ties for topk/max
    x = torch.randperm(24, generator=gen).float().reshape(4, 6) * 0.25 - 3
    ops_inputs = (x, torch.tensor([2, 0, 3]), torch.randn(2, 3, generator=gen), torch.randn(1, 3, generator=gen))
    torch.manual_seed(0)
    net = Net().eval()
    return {"ops": (Ops().eval(), ops_inputs), "net": (net, (torch.randn(2, 3, 6, 6, generator=gen),))}


CASES = _cases()
TOL = {"fp32": (1e-4, 1e-5), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2)}

FAST = ["torch_cpu_fp32", "torch_cpu_fp16", "torch_cpu_bf16"]
SLOW = ["onnx_cpu_fp32", "onnx_cpu_fp16", "executorch_cpu_fp32", "executorch_cpu_fp16",
        "executorch_portable_fp32", "executorch_portable_fp16", "inductor_cpu_fp32"]
ELSEWHERE = ["torch_cuda_fp32", "torch_cuda_fp16", "torch_cuda_bf16", "torch_mps_fp32", "torch_mps_fp16",
             "torch_mps_bf16", "inductor_cuda_fp32", "inductor_cuda_fp16", "inductor_cuda_bf16",
             "onnx_cuda_fp32", "onnx_cuda_fp16",
             "onnx_coreml_fp32", "onnx_coreml_fp16", "executorch_mps_fp32", "executorch_mps_fp16",
             "executorch_coreml_fp32", "executorch_coreml_fp16"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(preset name, case) -> (preset, artifact), exported once per test module."""
    cache: dict[tuple[str, str], tuple] = {}

    def get(name: str, case: str):
        if (name, case) not in cache:
            preset = get_preset(name)
            avail = availability(preset)
            if not (avail.can_export and avail.can_run):
                pytest.skip(f"{name}: {avail.reason}")
            module, inputs = CASES[case]
            workdir = tmp_path_factory.mktemp(f"{name}-{case}")
            cache[(name, case)] = (preset, backend_for(preset).export(module, inputs, preset, workdir))
        return cache[(name, case)]

    return get


def _check_against_eager(preset, outputs, case):
    module, inputs = CASES[case]
    with torch.no_grad():
        expected = module(*inputs)
    assert len(outputs) == len(expected), "an output was dropped or invented"
    rtol, atol = TOL[preset.precision]
    for i, (got, want) in enumerate(zip(outputs, expected)):
        assert got.device.type == "cpu"
        assert got.shape == want.shape, f"output {i}"
        if want.is_floating_point():
            assert got.is_floating_point(), f"output {i}: {got.dtype}"
            if preset.precision != "fp32" and preset.family != "coreml":
                assert got.dtype == preset.dtype, f"output {i} was not computed in {preset.precision}"
            torch.testing.assert_close(got.float(), want, rtol=rtol, atol=atol, msg=f"output {i}")
        else:
            assert got.dtype == want.dtype and torch.equal(got, want), f"output {i} (exact)"


def _run(name, case, exported):
    preset, artifact = exported(name, case)
    runnable = backend_for(preset).load(artifact, preset)
    _check_against_eager(preset, list(runnable(CASES[case][1])), case)
    return preset, artifact, runnable


@pytest.mark.parametrize("case", ["ops", "net"])
@pytest.mark.parametrize("name", FAST)
def test_eager_torch_matches(name, case, exported):
    _run(name, case, exported)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ops", "net"])
@pytest.mark.parametrize("name", SLOW)
def test_runtime_matches_eager(name, case, exported):
    if name.startswith("inductor") and case == "net":
        pytest.skip("one inductor compile (ops) keeps the suite fast; net is covered by eager/onnx/executorch")
    _, _, runnable = _run(name, case, exported)
    # a runnable serves repeated calls (latency repeats) with the same answers
    again = runnable(CASES[case][1])
    first = runnable(CASES[case][1])
    assert all(torch.equal(a, b) for a, b in zip(again, first))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["onnx_cpu_fp32", "executorch_portable_fp32"])
def test_serialized_artifact_loads_from_a_copied_directory(name, exported, tmp_path):
    """What the artifact cache relies on: the directory alone is the artifact."""
    preset, artifact = exported(name, "net")
    assert backend_for(preset).serializes and artifact.path is not None and artifact.obj is None
    copy = tmp_path / "copy"
    shutil.copytree(artifact.path, copy)
    runnable = backend_for(preset).load(Artifact(path=Path(copy)), preset)
    _check_against_eager(preset, list(runnable(CASES["net"][1])), "net")


@pytest.mark.parametrize("name", ELSEWHERE)
def test_presets_for_other_machines(name, exported):
    """CUDA / MPS / CoreML-runtime presets: run where available, else skip with the reason."""
    _run(name, "ops", exported)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["coreml_cpu_fp32", "coreml_any_fp16"])
def test_coreml_conversion_is_checked_here(name, tmp_path):
    import coremltools as ct

    preset = get_preset(name)
    avail = availability(preset)
    if not avail.can_export:
        pytest.skip(avail.reason)
    backend = backend_for(preset)
    module, inputs = CASES["ops"] if name.endswith("fp32") else CASES["net"]
    artifact = backend.export(module, inputs, preset, tmp_path)
    package = Path(artifact.path) / "model.mlpackage"
    assert (package / "Manifest.json").is_file()
    spec = ct.models.MLModel(str(package), skip_model_load=True).get_spec()
    assert len(spec.description.input) == len(inputs)
    with torch.no_grad():
        assert len(spec.description.output) == len(module(*inputs))  # no output dropped
    if sys.platform == "darwin":
        _check_against_eager(preset, backend.load(artifact, preset)(inputs), "ops" if name.endswith("fp32") else "net")
    else:
        assert not avail.can_run
        with pytest.raises(RuntimeError, match="macOS"):
            backend.load(artifact, preset)


@pytest.mark.slow
def test_executorch_coreml_lowering_is_checked_here(tmp_path):
    preset = get_preset("executorch_coreml_fp32")
    avail = availability(preset)
    if not avail.can_export:
        pytest.skip(avail.reason)
    module, inputs = CASES["net"]
    artifact = backend_for(preset).export(module, inputs, preset, tmp_path)
    assert (Path(artifact.path) / "model.pte").stat().st_size > 0
    if not avail.can_run:
        with pytest.raises(RuntimeError, match="macOS"):
            backend_for(preset).load(artifact, preset)


def test_reduced_precision_never_casts_integer_inputs_or_the_callers_module(exported):
    preset, artifact = exported("torch_cpu_fp16", "net")
    module, _ = CASES["net"]
    assert module.fc.weight.dtype == torch.float32  # export worked on a copy
    assert artifact.obj.fc.weight.dtype == torch.float16
    preset, artifact = exported("torch_cpu_fp16", "ops")
    run = backend_for(preset).load(artifact, preset)
    outs = run(CASES["ops"][1])
    assert outs[5].dtype == torch.int64 and torch.equal(outs[5], CASES["ops"][1][1] * 2)


def test_onnx_exports_with_the_translation_table_built_once_are_byte_identical(tmp_path):
    """check builds torch.onnx's table of ATen translations once per process; the models it
    writes then must be the very bytes an export with the table rebuilt would write."""
    import subprocess

    script = f"""
import torch
from pathlib import Path
from opdiff_snap.backends.onnx import onnx_export, reuse_torchlib_registry

torch.manual_seed(0)
cases = [(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.GELU()).eval(), (torch.randn(1, 3, 8, 8),)),
         (torch.nn.LayerNorm(8).eval(), (torch.randn(2, 8),))]
def export_all(tag):
    out = []
    for i, (module, args) in enumerate(cases):
        path = Path({str(tmp_path)!r}) / f"{{tag}}{{i}}.onnx"
        onnx_export(module, args, {{}}, path)
        out.append(path.read_bytes())
    return out
plain = export_all("plain")
assert reuse_torchlib_registry()
assert export_all("once") == plain == export_all("again")
print("same")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("same"), proc.stderr[-3000:]


class Bf16Out(torch.nn.Module):
    def forward(self, x, y):
        return x.reshape(2, -1), x.float() * y, (x.float() + 1).to(torch.bfloat16)


def test_onnx_runtime_takes_and_gives_bfloat16_values(tmp_path):
    """NumPy has no bfloat16: a graph with bfloat16 inputs or outputs is fed and read through
    ONNX Runtime's own values, and gives eager's bits (the ops here are exact in bfloat16),
    a float32 output beside them included; an empty bfloat16 tensor keeps its shape."""
    pytest.importorskip("onnxruntime")
    preset = get_preset("onnx_cpu_fp32")
    x = (torch.arange(-6, 6, dtype=torch.float32) * 0.375).to(torch.bfloat16)
    y = torch.linspace(-1, 1, 12)
    backend = backend_for(preset)
    run = backend.load(backend.export(Bf16Out().eval(), (x, y), preset, tmp_path / "bf16"), preset)
    outs, want = run((x, y)), Bf16Out()(x, y)
    assert [o.dtype for o in outs] == [torch.bfloat16, torch.float32, torch.bfloat16]
    assert all(torch.equal(o, w) for o, w in zip(outs, want))
    empty = torch.empty(0, dtype=torch.bfloat16)
    run = backend.load(backend.export(Bf16Out().eval(), (empty, torch.empty(0)), preset, tmp_path / "empty"), preset)
    assert [tuple(o.shape) for o in run((empty, torch.empty(0)))] == [(2, 0), (0,), (0,)]
