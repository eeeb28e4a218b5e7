"""Pieces of tests/test_pytest_plugin.py: the plugin installed through its entry point,
a recorded project whose items cover every verdict, and JUnit parsing."""

from __future__ import annotations

import contextlib
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from .. import TESTS

CHECK_HELPERS = TESTS / "helpers" / "check"
CRASHY = TESTS / "helpers" / "execution" / "crashy.py"

# The plugin as the package's own metadata registers it, plus the test backends.
ENTRY_POINTS = """[pytest11]
opdiff = opdiff_snap.pytest_plugin
[opdiff_snap.backends]
perturb = helpers.check.opdiff_perturb:PerturbBackend
stages = helpers.pytest.stages:StagesBackend
"""

VERDICTS_SUITE = """\
dims: {N: 4}
presets:
  x: {type: tensor, shape: [2, N], dtype: float32, init: normal}
tests:
  - {id: relu, op: aten::relu.default, in: [{ref: x}], tags: [activation]}
  - {id: exp, op: aten::exp.default, in: [{ref: x}], tags: [math]}
  - {id: neg, op: aten::neg.default, in: [{ref: x}], skip: {"perturb_*": "known gap on perturb (test)"}}
  - {id: scale, op: {type: module, path: "file:mods.py::Scale", args: [2.0]}, in: [{ref: x}], tags: [module]}
  - {id: sin, op: aten::sin.default, in: [{ref: x}], tags: [math]}
"""
# after recording: `gone` leaves the suite (its golden stays), `fresh` joins it (no golden)
RECORDED_ONLY = "  - {id: gone, op: aten::cos.default, in: [{ref: x}]}\n"
ADDED_LATER = "  - {id: fresh, op: aten::abs.default, in: [{ref: x}], tags: [math]}\n"

PYPROJECT = """\
[tool.opdiff]
repeats = 1
warmup = 0
timeout_s = 10.0
jobs = 1   # one worker: its replacement after a crash or a hang is what is tested
"""


def make_site(root: Path) -> Path:
    """A folder holding only a *.dist-info that registers the plugin (pytest11, as the
    package's metadata does) and the test backends; on PYTHONPATH it installs them."""
    info = root / "opdiff_pytest_test-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: opdiff-pytest-test\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return root


def recorded_verdicts_project(root: Path) -> Path:
    """A project recorded on torch_cpu_fp32, then changed so that its items cover every
    planned verdict: `scale`'s file: module edited (STALE), `sin`'s golden damaged
    (CORRUPT when read), `gone` no longer in the suite (an orphan golden, STALE), `fresh`
    new (NO_GOLDEN)."""
    from opdiff_snap import api
    from opdiff_snap.core.config import load_settings
    from opdiff_snap.goldens import store_key

    (root / "suites").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    suite = root / "suites" / "verdicts.yaml"
    suite.write_text(VERDICTS_SUITE + RECORDED_ONLY)
    shutil.copy(CHECK_HELPERS / "mods.py", root / "suites" / "mods.py")
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=load_settings(root))
    assert report.counts() == {"RECORDED": 6}, report.counts()
    suite.write_text(VERDICTS_SUITE + ADDED_LATER)
    with open(root / "suites" / "mods.py", "a") as f:
        f.write("\n# edited after record\n")
    golden = root / "goldens" / store_key("sin", 0) / "0"
    data = bytearray(golden.read_bytes())
    data[3] ^= 0xFF
    golden.write_bytes(bytes(data))
    return root


def junit_cases(path: Path) -> dict[str, tuple[str, str]]:
    """{classname::name: (outcome, text)} of a JUnit file; outcome is passed, failed,
    skipped or error, text the failure or skip message and body."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, text = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = (node.get("message") or "") + "\n" + (node.text or "")
                break
        out[f"{case.get('classname')}::{case.get('name')}"] = (outcome, text)
    return out
