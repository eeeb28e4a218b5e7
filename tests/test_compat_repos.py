"""Repositories laid out the way opdiff users lay them out load unchanged.

Each fixture under tests/compat/ is copied to a temporary folder and made a git
repository, as a clone would be. The CLI runs in a fresh process (as a user runs it),
from the repository root and from an unrelated folder, and must list exactly the ids
that opdiff's expansion rules give; record on torch and check on ONNX Runtime must
give only PASS, with goldens recorded from one folder and checked from another.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import run

HERE = Path(__file__).resolve().parent
COMPAT = HERE / "compat"

# name -> (suite path inside the repository, ids in opdiff's order)
REPOS = {
    "opdiff_layout": ("examples/suite.yaml", [
        "add_two_refs", "add_scaled", "sum_keepdim", "transpose_last", "mul_rank0", "stacked",
        "linear_grid__bias=True__in_features=N__out_features=2",
        "linear_grid__bias=True__in_features=N__out_features=5",
        "linear_grid__bias=False__in_features=N__out_features=2",
        "linear_grid__bias=False__in_features=N__out_features=5",
        "linear_matched__in_features=4__out_features=3__x=x_w4",
        "linear_matched__in_features=4__out_features=6__x=x_w4",
        "linear_matched__in_features=8__out_features=3__x=x_w8",
        "linear_matched__in_features=8__out_features=6__x=x_w8",
        "norm_head", "elementwise__kind=abs", "elementwise__kind=cube", "elementwise__kind=neg",
        "norm_pair__hidden=8", "norm_pair__hidden=16",
    ]),
    "orchestrator": ("suites/all.yaml", [
        "conv3x3", "pool__kernel_size=2", "pool__kernel_size=4", "relu_image",
        "embed", "norm_hidden", "gelu__approximate=none", "gelu__approximate=tanh",
    ]),
    "suite_relative": ("suites/blocks.yaml", [
        "gate", "gate_wide__hidden=2", "gate_wide__hidden=8", "residual_gate", "tanh",
    ]),
}


def clone(name: str, tmp_path: Path) -> Path:
    repo = tmp_path / name
    shutil.copytree(COMPAT / name, repo)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


opdiff = functools.partial(run, timeout=600)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    d = tmp_path / "elsewhere"
    d.mkdir()
    return d


@pytest.mark.parametrize("name", sorted(REPOS))
def test_ids_are_opdiffs_from_the_root_and_from_elsewhere(name, tmp_path, elsewhere):
    suite, expected = REPOS[name]
    repo = clone(name, tmp_path)
    from_root = opdiff(repo, "list-tests", "--long", suite)
    from_elsewhere = opdiff(elsewhere, "list-tests", "--long", str(repo / suite))
    for result in (from_root, from_elsewhere):
        assert result.returncode == 0, result.stderr
        assert [line.split("\t")[0] for line in result.stdout.splitlines()] == expected
    # same definitions and spec hashes wherever the run starts
    assert from_root.stdout == from_elsewhere.stdout


def test_a_directory_of_suites_runs_the_orchestrator_once(tmp_path):
    repo = clone("orchestrator", tmp_path)
    result = opdiff(repo, "list-tests", "suites")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == REPOS["orchestrator"][1]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REPOS))
def test_record_from_the_root_and_check_from_elsewhere_all_pass(name, tmp_path, elsewhere):
    suite, expected = REPOS[name]
    repo = clone(name, tmp_path)
    rec = opdiff(repo, "record", "--baseline", "torch_cpu_fp32", "--format", "json", suite)
    assert rec.returncode == 0, rec.stderr
    assert sorted(r["id"] for r in json.loads(rec.stdout)["results"]) == sorted(expected)
    chk = opdiff(elsewhere, "--goldens", str(repo / "goldens"), "--store", str(repo / "store"), "check",
                 str(repo / suite), "-b", "onnx_cpu_fp32", "-j", "2", "--format", "json")
    results = json.loads(chk.stdout)["results"]
    bad = [(r["id"], r["status"], r["message"]) for r in results if r["status"] != "PASS"]
    assert not bad
    assert sorted(r["id"] for r in results) == sorted(expected)
    assert chk.returncode == 0, chk.stderr


def test_opdiff_command_line_flags_are_understood(tmp_path):
    repo = clone("suite_relative", tmp_path)
    suite = REPOS["suite_relative"][0]
    rec = opdiff(repo, "record", "--backends", "torch_cpu_fp32", "--num-sampled-inputs", "2",
                 "--skips", "tanh:*", "--format", "json", suite)
    assert rec.returncode == 0, rec.stderr
    rows = {(r["id"], r["seed"]): r["status"] for r in json.loads(rec.stdout)["results"]}
    assert rows[("gate", 1)] == "RECORDED" and rows[("tanh", 0)] == "SKIPPED"
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps({"torch_cpu_fp16": {"torch_overrides": {}}}))
    chk = opdiff(repo, "check", suite, "--backends", "torch_cpu_fp32;torch_cpu_bf16", "--num-sampled-inputs", "2",
                 "--skips", "gate_wide*:*bf16;tanh:*", "--backend-overrides-file", str(overrides),
                 "--in-process", "--format", "json")
    results = json.loads(chk.stdout)["results"]
    by = {(r["id"], r["seed"], r["preset"]): r for r in results}
    assert len(results) == 5 * 2 * 2
    assert by[("gate_wide__hidden=2", 1, "torch_cpu_bf16")]["status"] == "SKIPPED"
    assert "--skips gate_wide*:*bf16" in by[("gate_wide__hidden=2", 1, "torch_cpu_bf16")]["message"]
    assert by[("gate_wide__hidden=2", 1, "torch_cpu_fp32")]["status"] == "PASS"
    assert by[("tanh", 0, "torch_cpu_fp32")]["status"] == "SKIPPED"
    bad = opdiff(repo, "record", "--backends", "torch_cpu_fp32;onnx_cpu_fp32", suite)
    assert bad.returncode == 2 and "--baseline" in bad.stderr and "Traceback" not in bad.stderr
    bad = opdiff(repo, "check", suite, "--skips", "nocolon", "--backends", "torch_cpu_fp32")
    assert bad.returncode == 2 and "TEST_ID:PRESET" in bad.stderr and "Traceback" not in bad.stderr


# ---------------------------------------------------------------- errors that name every place

def _fails(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def test_a_conflicting_redefinition_names_both_places(tmp_path):
    repo = clone("orchestrator", tmp_path)
    text = repo / "suites" / "text.yaml"
    text.write_text(text.read_text().replace("include: [common.yaml]\n", "include: [common.yaml]\ndims: {D: 16}\n"))
    _fails(opdiff(repo, "validate", "suites/all.yaml"),
           "dim 'D' is defined as 16 here and as 8 at", "suites/common.yaml:7", "suites/text.yaml:2")
    text.write_text(text.read_text().replace("dims: {D: 16}\n", "presets: {image: {type: const, value: 1}}\n"))
    _fails(opdiff(repo, "validate", "suites/all.yaml"),
           "preset 'image' is defined here and differently at", "suites/common.yaml:10", "suites/text.yaml:2")


def test_tests_reached_twice_through_a_diamond_are_duplicates_naming_both_paths(tmp_path):
    repo = clone("orchestrator", tmp_path)
    (repo / "suites" / "common.yaml").write_text(
        (repo / "suites" / "common.yaml").read_text()
        + "tests:\n  - {id: shared, op: aten::relu, in: [{ref: hidden}]}\n")
    _fails(opdiff(repo, "validate", "suites/all.yaml"), "duplicate test id 'shared'",
           "suites/all.yaml -> suites/vision.yaml -> suites/common.yaml",
           "suites/all.yaml -> suites/text.yaml -> suites/common.yaml")


def test_an_ambiguous_file_path_names_every_file(tmp_path):
    repo = clone("opdiff_layout", tmp_path)
    stray = repo / "examples" / "examples"
    stray.mkdir()
    (stray / "heads.py").write_text("class NormHead: pass\n")
    _fails(opdiff(repo, "validate", "examples/suite.yaml"), "file:examples/heads.py is ambiguous",
           "examples/examples/heads.py", "examples/heads.py")
    # the same bytes in two places are one file, not an ambiguity
    shutil.copy(repo / "examples" / "heads.py", stray / "heads.py")
    assert opdiff(repo, "validate", "examples/suite.yaml").returncode == 0


def test_a_missing_file_path_names_every_place_tried(tmp_path, elsewhere):
    repo = clone("opdiff_layout", tmp_path)
    suite = repo / "examples" / "suite.yaml"
    suite.write_text(suite.read_text().replace("file:examples/heads.py::NormHead", "file:examples/head.py::NormHead"))
    result = opdiff(elsewhere, "validate", str(suite))
    places = [repo / "examples" / "examples" / "head.py",   # the suite's folder
              elsewhere / "examples" / "head.py",            # the current directory
              repo / "examples" / "head.py"]                 # the project root
    _fails(result, "file:examples/head.py: file not found; looked in "
           + ", ".join(os.path.relpath(p, elsewhere) for p in places))


def test_sibling_imports_leave_sys_path_as_it_was(tmp_path, monkeypatch):
    from opdiff_snap.suite import load_suites

    repo = clone("opdiff_layout", tmp_path)
    monkeypatch.chdir(tmp_path)  # not the root: the project root (a git repository) makes it importable
    before = list(sys.path)
    try:
        cases = {c.id: c for c in load_suites([repo / "examples" / "suite.yaml"])}
    finally:
        for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
            del sys.modules[name]
    assert sys.path == before
    assert list(cases) == REPOS["opdiff_layout"][1]
    assert repo in cases["norm_head"].import_dirs
    # definitions hold the path relative to the suite's folder, whatever the suite wrote
    assert cases["norm_head"].call.target == "file:heads.py::NormHead"
    assert cases["norm_head"].call.args[0]["path"] == "file:blocks.py::BlockConfig"
