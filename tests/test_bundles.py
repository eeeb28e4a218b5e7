"""Replay bundles: `opdiff bundle` writes what check would run, the runners run it with only
their runtime, and `check --outputs-from` judges what came back exactly as check judges:
the same verdicts as a check here, a planted wrong output caught, and a bundle changed
in transit, a missing output or a re-recorded golden each told apart."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import invoke
from helpers.record import record_here

SUITE = """\
defaults: {seeds: 1}
dims: {B: 3, N: 8}
presets:
  x: {type: tensor, shape: [B, N], dtype: float32, init: normal}
  y: {type: tensor, shape: [B, N], dtype: float32, init: normal}
tests:
  - {id: exp, op: aten::exp.default, in: [{ref: x}]}
  - {id: add, op: aten::add.Tensor, in: [{ref: x}, {ref: y}]}
  - {id: max_dim, op: aten::max.dim, in: [{ref: x}, {type: const, value: 1}]}
  - {id: linear, op: {type: module, path: torch.nn.Linear, args: [8, 4]}, in: [{ref: x}]}
"""
PRESETS = ("onnx_cpu_fp32", "onnx_cpu_fp16", "executorch_cpu_fp32")


# runs a runner with torch and this package made unimportable, as on a device that has neither
WITHOUT_TORCH = """
import runpy, sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "opdiff_snap"):
            raise ImportError(f"{name} is not on this device")
sys.meta_path.insert(0, Refuse())
script = sys.argv[1]
sys.path.insert(0, script.rsplit("/", 1)[0])
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""


def _run_runner(bundle: Path, family: str) -> subprocess.CompletedProcess:
    script = [str(bundle / f"run_{family}.py"), "--repeats", "2"]
    if family != "executorch":   # ExecuTorch's Python runtime takes torch tensors
        script = ["-c", WITHOUT_TORCH, *script]
    return subprocess.run([sys.executable, *script], capture_output=True, text=True, timeout=300, cwd=bundle.parent)


def _items(path: str | Path) -> dict[tuple[str, int, str], dict]:
    items = {}
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        if d.get("type") == "item":
            items[(d["id"], d["seed"], d["preset"])] = d
    return items


def _check(project: Path, *args: str) -> tuple[int, dict]:
    code, out, err = invoke(project, "check", "--format", "json", *args)
    return code, (json.loads(out) if out.strip().startswith("{") else {"out": out, "err": err})


@pytest.fixture(scope="module")
def returned(tmp_path_factory):
    """A recorded project, its bundle on three presets, and the bundle after both runners ran."""
    project = tmp_path_factory.mktemp("bundle_project")
    assert record_here(project, SUITE).counts() == {"RECORDED": 4}
    code, out, err = invoke(project, "bundle", "-o", str(project / "bundle"), *(f"-b{p}" for p in PRESETS))
    assert code == 0, out + err
    assert "12 entries" in out, out
    bundle = project / "bundle"
    for family in ("onnx", "executorch"):
        r = _run_runner(bundle, family)
        assert r.returncode == 0, r.stdout + r.stderr
    return project, bundle


def _copy(returned, tmp_path: Path) -> tuple[Path, Path]:
    project, bundle = returned
    copy = tmp_path / "project"
    shutil.copytree(project, copy, ignore=shutil.ignore_patterns("store"))
    return copy, copy / "bundle"


@pytest.mark.slow
def test_outputs_from_gives_the_verdicts_of_a_check_here(returned, tmp_path):
    project, bundle = _copy(returned, tmp_path)
    code, replayed = _check(project, "--outputs-from", str(bundle))
    assert code == 0, replayed
    code, here = _check(project, *(f"-b{p}" for p in PRESETS))
    assert code == 0, here
    a, b = _items(project / replayed["history"]), _items(project / here["history"])
    assert set(a) == set(b) and len(a) == 12
    for key in a:
        assert a[key]["status"] == b[key]["status"] == "PASS", key
        assert a[key]["tolerance"] == b[key]["tolerance"]
        assert a[key]["metrics"]["max_abs"] == pytest.approx(b[key]["metrics"]["max_abs"], rel=1e-6, abs=1e-12), key
        assert len(a[key]["infer_ms_all"]) == 2   # the device's own timings, two repeats
    meta = json.loads((project / replayed["history"]).read_text().splitlines()[0])
    assert meta["settings"]["outputs_from"] == str(bundle)
    assert meta["env"]["build"]["torch"] and meta["env"]["onnxruntime"]


@pytest.mark.slow
def test_a_planted_wrong_output_is_a_mismatch_naming_the_test(returned, tmp_path):
    project, bundle = _copy(returned, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = next(e for e in manifest["entries"] if e["test"] == "exp" and e["preset"] == "executorch_cpu_fp32")
    path = bundle / "outputs" / f"{entry['id']}.npz"
    with np.load(path) as npz:
        out = npz["out0"].copy()
    out[0, 0] += 0.5
    np.savez(path, out0=out)
    code, report = _check(project, "--outputs-from", str(bundle))
    assert code == 1
    bad = [r for r in report["results"] if r["status"] != "PASS"]
    assert [(r["id"], r["preset"], r["status"]) for r in bad] == [("exp", "executorch_cpu_fp32", "MISMATCH")]


@pytest.mark.slow
def test_a_changed_artifact_is_refused_before_anything_is_judged(returned, tmp_path):
    project, bundle = _copy(returned, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["entries"][0]
    victim = next(p for p in (bundle / entry["artifact"]).iterdir() if p.is_file())
    victim.write_bytes(victim.read_bytes() + b"\0")
    code, out, err = invoke(project, "check", "--outputs-from", str(bundle))
    assert code == 2
    assert entry["id"] in err and "digest" in err and "Traceback" not in err
    assert not list((project / "store").glob("runs/*.jsonl"))   # the copy holds no history: nothing was written


@pytest.mark.slow
def test_missing_outputs_misfit_outputs_and_a_rerecorded_golden(returned, tmp_path):
    project, bundle = _copy(returned, tmp_path)
    entries = {(e["test"], e["preset"]): e for e in json.loads((bundle / "manifest.json").read_text())["entries"]}
    (bundle / "outputs" / f"{entries['add', 'onnx_cpu_fp32']['id']}.npz").unlink()
    np.savez(bundle / "outputs" / f"{entries['linear', 'onnx_cpu_fp32']['id']}.npz", out0=np.zeros((2, 2), "f4"))
    device = json.loads((bundle / "device-executorch.json").read_text())
    del device["results"][entries["add", "executorch_cpu_fp32"]["id"]]
    (bundle / "device-executorch.json").write_text(json.dumps(device))
    code, out, err = invoke(project, "record", "--force", "--test-ids", "max_dim")
    assert code == 0, out + err
    code, report = _check(project, "--outputs-from", str(bundle))
    status = {(r["id"], r["preset"]): r["status"] for r in report["results"]}
    assert status["add", "onnx_cpu_fp32"] == "UNAVAILABLE"
    assert status["add", "executorch_cpu_fp32"] == "UNAVAILABLE"
    assert status["linear", "onnx_cpu_fp32"] == "STRUCTURE_MISMATCH"
    assert {status["max_dim", p] for p in PRESETS} == {"STALE"}
    assert status["exp", "onnx_cpu_fp16"] == "PASS"
    messages = {(r["id"], r["preset"]): r["message"] for r in report["results"]}
    assert "run_onnx.py" in messages["add", "onnx_cpu_fp32"]
    assert "opdiff bundle" in messages["max_dim", "onnx_cpu_fp32"]


def test_bundle_refuses_presets_with_no_standalone_artifact_and_a_used_folder(tmp_path):
    record_here(tmp_path, SUITE)
    code, out, err = invoke(tmp_path, "bundle", "-b", "torch_cpu_fp32", "-o", str(tmp_path / "b"))
    assert code == 2 and "torch_cpu_fp32" in err and "onnx_*" in err and "Traceback" not in err
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    code, out, err = invoke(tmp_path, "bundle", "-b", "onnx_cpu_fp32", "-o", str(tmp_path / "used"))
    assert code == 2 and "empty folder" in err
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"


def test_outputs_from_a_folder_that_is_no_bundle_is_an_input_error(tmp_path):
    record_here(tmp_path, SUITE)
    (tmp_path / "nb").mkdir()
    code, out, err = invoke(tmp_path, "check", "--outputs-from", str(tmp_path / "nb"))
    assert code == 2 and "manifest" in err and "Traceback" not in err
    (tmp_path / "nb" / "manifest.json").write_text('{"format": 1, "entries": [{"id": "../x"}]}')
    code, out, err = invoke(tmp_path, "check", "--outputs-from", str(tmp_path / "nb"))
    assert code == 2 and "not one `opdiff bundle` wrote" in err
    # a verdict of a comparison cannot be carried for a test the bundle holds no outputs of
    forged = {"format": 1, "created": "x", "build": {}, "presets": {"onnx_cpu_fp32": {}}, "entries": [],
              "left_out": [{"test": "exp", "seed": 0, "preset": "onnx_cpu_fp32", "verdict": "PASS", "message": ""}]}
    (tmp_path / "nb" / "manifest.json").write_text(json.dumps(forged))
    runs = sorted((tmp_path / "store").glob("runs/*.jsonl"))
    code, out, err = invoke(tmp_path, "check", "--outputs-from", str(tmp_path / "nb"))
    assert code == 2 and "cannot be PASS" in err and sorted((tmp_path / "store").glob("runs/*.jsonl")) == runs


@pytest.mark.slow
def test_a_coreml_bundle_is_written_here_and_its_runner_refuses_off_macos(tmp_path):
    record_here(tmp_path, SUITE)
    code, out, err = invoke(tmp_path, "bundle", "-b", "coreml_any_fp16", "-o", str(tmp_path / "b"),
                            "--test-ids", "add;linear")
    assert code == 0, out + err
    bundle = tmp_path / "b"
    entries = json.loads((bundle / "manifest.json").read_text())["entries"]
    assert [(e["test"], e["compute_units"]) for e in entries] == [("add", "ALL"), ("linear", "ALL")]
    assert all(next((bundle / e["artifact"]).glob("*.mlpackage")).is_dir() for e in entries)
    assert sorted(p.name for p in bundle.glob("*.py")) == ["bundle_io.py", "run_coreml.py"]
    if sys.platform == "darwin":
        pytest.skip("on macOS the runner predicts; this test is about running it elsewhere")
    r = _run_runner(bundle, "coreml")
    assert r.returncode != 0 and "only on macOS" in r.stderr and "Nothing was run" in r.stderr
    assert not (bundle / "device-coreml.json").exists()
    code, report = _check(tmp_path, "--outputs-from", str(bundle))
    assert {r["status"] for r in report["results"]} == {"UNAVAILABLE"}
    assert all("run_coreml.py" in r["message"] for r in report["results"])


def test_executorch_verifies_the_bundled_program_of_an_entry(returned, tmp_path):
    from opdiff_snap.execution.bundled_program import verify_bundled_program

    project, bundle = returned
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = next(e for e in manifest["entries"] if e["test"] == "linear" and e["preset"] == "executorch_cpu_fp32")
    path = bundle / entry["bundled_program"]
    assert verify_bundled_program(path, rtol=1e-5, atol=1e-6) == ""

    # the same program with a wrong expected output: ExecuTorch's own verification fails it
    from executorch.devtools.bundled_program.serialize import (
        deserialize_from_flatbuffer_to_bundled_program,
    )

    from opdiff_snap.execution.bundled_program import write_bundled_program

    schema = deserialize_from_flatbuffer_to_bundled_program(path.read_bytes())
    pte = tmp_path / "model.pte"
    pte.write_bytes(bytes(schema.program))
    import torch

    with np.load(bundle / entry["inputs"]) as npz:
        inputs = [torch.from_numpy(npz["in0"])]
    wrong = tmp_path / "wrong.bpte"
    write_bundled_program(pte, inputs, [torch.zeros(3, 4)], wrong)
    assert verify_bundled_program(wrong, rtol=1e-5, atol=1e-6) != ""
