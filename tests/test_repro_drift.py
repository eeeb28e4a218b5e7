"""A repro script reaches the verdict and the metrics `opdiff check` reached.

Goldens for a few small ops and modules are recorded once (module scope) and checked on
every preset that runs here; then, for each (test, preset), `opdiff repro` writes the
script, which runs in a fresh interpreter with the project not importable, and its last
line (JSON) is held against check's JSONL item for the same (test, seed, preset).

The sample (one or two tests per preset, so the file stays quick) has an op whose expected values hold zeros
(relu: max_rel must leave them out as check does), a module with weights, a test that
MISMATCHes (wrongkernel_cpu_fp32, a test family with kernels wrong on purpose) and a
module torch.export cannot export (an EXPORT_FAIL on ONNX and ExecuTorch), and on fp16 an
elementwise op judged against its exact answer (wrongkernel_cpu_fp16) and a module whose
outputs are all shifted one way (bugoffset_cpu_fp16, caught by the bias bound or the
normwise one).

Tolerance on the metrics: both sides compute the same float64 differences of the same
tensors, but check sums mean_abs with numpy and the script with torch, in other orders:
the means may differ in the last bits (rel 1e-9 covers it). max_abs and max_rel are maxima
of identical float64 values and compare exactly; mismatched and numel are counts, and the
bound that failed is the same: the script carries check's bands (tolerance, rounding bound,
float64 reference, elementwise exact answer) and its bias bound.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
from helpers.cause import run_isolated
from helpers.check import make_site, plugin_installed
from helpers.numerics import ENTRY_POINTS
from helpers.numerics.planted import ENTRY_POINT_LINES

from opdiff_snap import api
from opdiff_snap.backends.registry import backend_for, get_preset
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict

pytestmark = pytest.mark.slow

MODS = Path(__file__).resolve().parent / "helpers" / "numerics" / "mods.py"

SUITE = """
dims: {B: 4, N: 8}
presets:
  x: {type: tensor, shape: [B, N], kind: float, init: normal}
tests:
  - {id: relu, op: aten::relu.default, in: [{ref: x}]}
  - {id: exp, op: aten::exp.default, in: [{ref: x}]}
  - {id: tanh_mlp, op: {type: module, path: "file:mods.py::TanhMLP"}, in: [{ref: x}]}
  - {id: branchy, op: {type: module, path: "file:drift_mods.py::Branchy"}, in: [{ref: x}]}
"""

DRIFT_MODS = '''
import torch


class Branchy(torch.nn.Module):
    """Control flow on a value: eager runs it, torch.export cannot trace it."""

    def forward(self, x):
        if float(x.sum()) > 0:
            return x * 2.0
        return x - 1.0
'''

# (preset, tests): every preset that may run here; a test family that is wrong on purpose
# gives the MISMATCH, torch.export the EXPORT_FAIL.
CASES = [
    ("torch_cpu_fp32", ["relu"]),
    ("torch_cpu_fp16", ["tanh_mlp"]),
    ("inductor_cpu_fp32", ["tanh_mlp"]),
    ("onnx_cpu_fp32", ["tanh_mlp", "branchy"]),
    ("onnx_cpu_fp16", ["relu"]),
    ("executorch_cpu_fp32", ["tanh_mlp", "branchy"]),
    ("executorch_cpu_fp16", ["tanh_mlp"]),
    ("executorch_portable_fp32", ["relu"]),
    ("executorch_portable_fp16", ["relu"]),
    ("wrongkernel_cpu_fp32", ["exp"]),
    ("wrongkernel_cpu_fp16", ["exp", "relu"]),
    ("bugoffset_cpu_fp16", ["tanh_mlp"]),
    ("coreml_cpu_fp32", ["tanh_mlp"]),
]
PARAMS = [(preset, test) for preset, tests in CASES for test in tests]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("site"), ENTRY_POINTS + ENTRY_POINT_LINES, "opdiff-drift-test")
    with plugin_installed(site):
        yield site


def _runnable(name: str) -> str | None:
    """Why `name` cannot run here, or None."""
    preset = get_preset(name)
    avail = backend_for(preset).availability(preset)
    return None if avail.can_export and avail.can_run else avail.reason


@pytest.fixture(scope="module")
def checked(site, tmp_path_factory):
    """A project with its goldens recorded and checked once on every preset that runs here:
    (root, {(test, preset): the check's JSONL item})."""
    root = tmp_path_factory.mktemp("drift")
    (root / "suites").mkdir()
    (root / "suites" / "drift.yaml").write_text(SUITE)
    shutil.copy(MODS, root / "suites" / "mods.py")
    (root / "suites" / "drift_mods.py").write_text(DRIFT_MODS)
    settings = Settings(suites=Path("suites"), repeats=1, warmup=0, jobs=1)
    # one check per set of tests, on the presets that repro those tests only
    presets_of: dict[tuple[str, ...], list[str]] = {}
    for name, tests in CASES:
        if _runnable(name) is None:
            presets_of.setdefault(tuple(tests), []).append(name)
    items = []
    with contextlib.chdir(root):
        recorded = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        assert {r.verdict for r in recorded.results} == {Verdict.RECORDED}
        for tests, presets in presets_of.items():
            report = api.check(api.CheckRequest(backends=presets, selection=api.Selection(test_ids=tests),
                                                running=api.Running(in_process=True)), settings=settings)
            items += [json.loads(line) for line in Path(report.path).read_text().splitlines()]
    return root, {(i["id"], i["preset"]): i for i in items if i.get("type") == "item"}


@pytest.mark.parametrize("preset,test", PARAMS, ids=[f"{p}-{t}" for p, t in PARAMS])
def test_repro_reaches_checks_verdict_and_metrics(checked, preset, test, tmp_path):
    reason = _runnable(preset)
    if reason is not None:
        pytest.skip(f"{preset} does not run here: {reason}")
    root, items = checked
    item = items[(test, preset)]
    script = api.repro(test, preset, tmp_path / "bug" / f"repro_{test}.py", goldens=root / "goldens",
                       suites=root / "suites")
    run = run_isolated(script, cwd=tmp_path)
    lines = run.stdout.strip().splitlines()
    assert lines, run.stderr
    got = json.loads(lines[-1])
    want = item["metrics"]
    if want is not None:      # check compared outputs: the script must have compared them too
        assert "metrics" in got, (run.stdout, run.stderr)
        metrics = got["metrics"]
        assert metrics["numel"] == want["numel"]
        assert metrics["mismatched"] == want["mismatched"]
        assert metrics["max_abs"] == want["max_abs"]
        assert metrics["max_rel"] == want["max_rel"]
        assert metrics["mean_abs"] == pytest.approx(want["mean_abs"], rel=1e-9, abs=0.0)
        assert metrics["failed_bound"] == want["failed_bound"]
    assert got["verdict"] == item["status"], (item["error_message"], run.stdout, run.stderr)
    assert run.returncode == (0 if item["status"] == "PASS" else 1)
