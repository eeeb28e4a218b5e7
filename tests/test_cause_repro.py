"""Generated repro scripts run standalone (project not importable) and detect mismatches."""

from __future__ import annotations

import shutil

import pytest
from helpers.cause import baseline_outputs, load_case, run_isolated

from opdiff_snap.backends.base import Preset
from opdiff_snap.cause.repro import write_repro
from opdiff_snap.suite.model import Tolerance

FP32 = Tolerance(atol=1e-5, rtol=1.3e-6)


def _preset(name: str) -> Preset:
    from opdiff_snap.backends.registry import get_preset
    return get_preset(name)


def _write(tmp_path, test_id, preset, perturb=0.0, tol=FP32):
    case, inv = load_case(test_id)
    expected = baseline_outputs(case, inv)
    if perturb:
        expected = expected.clone()
        expected.view(-1)[1] += perturb  # one planted wrong element
    out = tmp_path / "bug" / f"repro_{test_id}.py"
    return write_repro(case, (inv, expected), _preset(preset), out, tol)


def test_script_never_imports_the_project(tmp_path):
    script = _write(tmp_path, "net", "torch_cpu_fp32")
    text = script.read_text()
    assert "opdiff_snap" not in text
    assert (script.parent / "models.py").is_file()  # the file: module travels with it
    compile(text, str(script), "exec")


@pytest.mark.slow
def test_clean_torch_exits_zero_and_planted_mismatch_exits_one(tmp_path):
    clean = _write(tmp_path / "a", "net", "torch_cpu_fp32")
    bad = _write(tmp_path / "b", "net", "torch_cpu_fp32", perturb=1e-2)
    # move the scripts away from the repository before running them
    for script in (clean, bad):
        shutil.copytree(script.parent, tmp_path / "run" / script.parent.parent.name)
    r = run_isolated(tmp_path / "run" / "a" / clean.name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mismatched=0/24" in r.stdout and r.stdout.strip().splitlines()[-2] == "PASS"
    r = run_isolated(tmp_path / "run" / "b" / bad.name, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mismatched=1/24" in r.stdout and "MISMATCH" in r.stdout


@pytest.mark.slow
def test_op_repro_with_large_inputs_writes_data_beside_the_script(tmp_path):
    script = _write(tmp_path, "big_add", "torch_cpu_fp32")
    data = script.with_name(script.stem + "_data.pt")
    assert data.is_file() and data.stat().st_size > 256 * 1024
    assert "DATA_FILE" in script.read_text()
    r = run_isolated(script, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_fp16_op_repro_flags_planted_mismatch(tmp_path):
    script = _write(tmp_path, "add", "torch_cpu_fp16", perturb=0.5, tol=Tolerance(atol=1e-5, rtol=1e-3))
    assert "DATA_B64" in script.read_text()
    r = run_isolated(script, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mismatched=" in r.stdout


@pytest.mark.slow
def test_onnx_repro_clean_exits_zero(tmp_path):
    script = _write(tmp_path, "net", "onnx_cpu_fp32")
    r = run_isolated(script, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout


@pytest.mark.slow
def test_executorch_repro_clean_exits_zero(tmp_path):
    script = _write(tmp_path, "net", "executorch_cpu_fp32")
    r = run_isolated(script, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
