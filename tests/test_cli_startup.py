"""The commands that only read (help, the history, the goldens' states) run in a parent
that imports neither torch nor any backend: only workers do."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.check import copy_shipped
from helpers.history.synth import Res, Run, write_run

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "executorch", "onnxruntime", "onnx", "onnxscript", "coremltools", "ray", "torchao")

# Runs the CLI in a fresh interpreter, then prints which heavy top-level packages it imported.
PROBE = textwrap.dedent("""
    import json, sys
    from opdiff_snap.cli import main
    try:
        main(sys.argv[1:], prog_name="opdiff", standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = exc.code
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
    print("\\n" + json.dumps({"code": code, "heavy": heavy}))
""" % (HEAVY,))


def _imports(cwd: Path, *argv: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Two runs in the history, one golden, a suite with an ATen op and a torch.nn module."""
    root = tmp_path_factory.mktemp("project")
    for rid, day in (("a", 1), ("b", 2)):
        write_run(root / "store", Run(rid, f"2026-02-0{day}T00:00:00Z", [Res("abs", "onnx_cpu_fp32")]))
    assert copy_shipped(root / "goldens", lambda info: info.test_id == "abs" and info.seed == 0)
    (root / "suites").mkdir()
    (root / "suites" / "s.yaml").write_text(textwrap.dedent("""
        tests:
          - id: abs
            op: aten::abs
            in: [{type: tensor, shape: [3], dtype: float32, init: normal}]
          - id: lin
            op: {type: module, path: torch.nn.Linear, args: [3, 2]}
            in: [{type: tensor, shape: [2, 3], dtype: float32, init: normal}]
    """))
    return root


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["runs"],
    ["query", "SELECT count(*) FROM results"],
    ["report", "support"],
    ["report", "latency"],
    ["diff-runs", "a", "b"],
    ["goldens", "ls"],
])
def test_reading_commands_import_no_backend(project, argv):
    seen = _imports(project, *argv)
    assert seen["code"] in (0, None)
    assert seen["heavy"] == []


def test_help_imports_no_backend_per_importtime(project):
    """The same, read from `python -X importtime`: not one heavy package is imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "opdiff_snap.cli", "--help"], cwd=project,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Usage:" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert not {m for m in imported if m.split(".")[0] in HEAVY}
