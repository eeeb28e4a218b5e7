"""`opdiff ops --coverage`: the Core ATen ops the tests exercise, and per preset how many
of them the latest checks in the history ran and passed."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from helpers.check import make_site, opdiff, plugin_installed

from opdiff_snap import api
from opdiff_snap.cause.coverage import core_aten_ops, preset_coverage
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict

SUITE = """
presets:
  x: {type: tensor, shape: [2, 4], dtype: float32}
tests:
  - {id: abs, op: aten::abs.default, in: [{ref: x}]}
  - {id: exp, op: aten::exp.default, in: [{ref: x}]}
  - {id: neg, op: aten::neg.default, in: [{ref: x}]}
  - {id: lin, op: {type: module, path: torch.nn.Linear, args: [4, 3]}, in: [{ref: x}]}
"""


def test_the_core_set_is_torchs_tagged_overloads():
    core = core_aten_ops()
    assert len(core) > 150 and core == sorted(core)
    assert {"aten::abs.default", "aten::addmm.default", "aten::convolution.default"} <= set(core)
    assert "aten::linear.default" not in core   # decomposed before a backend sees it


def test_an_op_counts_as_lowered_and_passed_by_its_best_test_and_unchecked_without_one():
    exercised = {"aten::a.default": ["t1", "t2"], "aten::b.default": ["t2"], "aten::c.default": ["t3"]}
    latest = {("t1", "p"): (Verdict.PASS, True), ("t2", "p"): (Verdict.EXPORT_FAIL, False),
              ("t3", "q"): (Verdict.PASS, True)}
    got = preset_coverage("p", exercised, latest)
    assert (got.lowered, got.passed, got.not_checked, got.failing) == (1, 1, 1, [])
    latest[("t2", "p")] = (Verdict.MISMATCH, True)
    got = preset_coverage("p", exercised, latest)
    assert (got.lowered, got.passed, got.failing) == (2, 1, ["aten::b.default"])
    # converted where it cannot run (CoreML off macOS): lowered, not run, not failing
    latest[("t2", "p")] = (Verdict.UNAVAILABLE, True)
    got = preset_coverage("p", exercised, latest)
    assert (got.lowered, got.passed, got.converted_only, got.failing) == (2, 1, 1, [])
    latest[("t2", "p")] = (Verdict.UNAVAILABLE, False)      # never exported: not lowered
    assert preset_coverage("p", exercised, latest).lowered == 1


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """The suite recorded, then checked on the perturbing backend (exp wrong, neg never
    checked)."""
    root = tmp_path_factory.mktemp("coverage")
    (root / "suites").mkdir()
    (root / "suites" / "ops.yaml").write_text(SUITE)
    site = make_site(tmp_path_factory.mktemp("site"))
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0)
    with plugin_installed(site), contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        api.check(api.CheckRequest(backends=["perturb_cpu_fp32"],
                                   selection=api.Selection(test_ids=["abs", "exp", "lin"]),
                                   running=api.Running(in_process=True),
                                   preset_options={"perturb_cpu_fp32": {"perturb": ["aten::exp"]}}),
                                   settings=settings)
    return root, site, settings


def test_coverage_of_a_checked_suite(checked):
    root, site, settings = checked
    with plugin_installed(site), contextlib.chdir(root):
        found = api.coverage(settings=settings, in_process=True)
    # Linear reaches a backend as permute + addmm: the core ops, not the module's call
    assert set(found.exercised) == {"aten::abs.default", "aten::exp.default", "aten::neg.default",
                                    "aten::permute.default", "aten::addmm.default"}
    assert found.exercised["aten::addmm.default"] == ["lin"]
    assert len(found.not_covered) == len(found.core) - 5 and "aten::abs.default" not in found.not_covered
    (perturb,) = found.presets
    assert perturb.preset == "perturb_cpu_fp32"
    assert (perturb.lowered, perturb.passed, perturb.not_checked) == (4, 3, 1)
    assert perturb.failing == ["aten::exp.default"]
    # each test's ops are kept in the artifact cache: asking again exports nothing
    kept = {p: p.stat().st_mtime_ns for p in (root / ".opdiff-cache" / "core-ops").glob("*.json")}
    assert len(kept) == 4
    with plugin_installed(site), contextlib.chdir(root):
        again = api.coverage(settings=settings, in_process=True)
    assert again.exercised == found.exercised
    assert {p: p.stat().st_mtime_ns for p in kept} == kept     # read, not written again


def test_the_command_prints_the_numbers_and_json(checked):
    root, site, _ = checked
    out = opdiff(root, site, "ops", "--coverage", "-j", "1")
    assert out.returncode == 0, out.stderr
    assert f"5 of {len(core_aten_ops())} Core ATen ops exercised" in out.stdout
    assert "perturb_cpu_fp32" in out.stdout and "3 of 5" in out.stdout
    data = json.loads(opdiff(root, site, "ops", "--coverage", "--format", "json", "-j", "1").stdout)
    assert data["presets"][0]["passed"] == 3 and data["presets"][0]["not_checked"] == 1
    assert data["exercised"]["aten::exp.default"] == ["exp"]
