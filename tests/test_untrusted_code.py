"""Goldens never run code, user code runs only in workers, resume keeps its promises.

Each case runs the real CLI in a subprocess, as a user (or an attacker) would, and
asserts its exit code and message, that no traceback was printed, that no command
planted in the input ran, and that nothing outside the project's stores changed."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run

from opdiff_snap.goldens import GoldenStore, store_key
from opdiff_snap.suite.spechash import spec_hash

STORES = ("goldens", "store", ".opdiff-cache")

SUITE = """\
tests:
  - {id: neg, op: aten::neg.default, in: [{type: tensor, shape: [2, 3], kind: float}]}
  - {id: user, op: {type: module, path: "file:mods.py::Block"}, in: [{type: tensor, shape: [2, 3], kind: float}]}
"""
BLOCK = """
import torch


class Block(torch.nn.Module):
    def forward(self, x):
        return x * 2
"""
AT_IMPORT = {
    "exits": "import sys\nsys.exit(3)\n",
    "exits_zero": "import os\nos._exit(0)\n",
    "crashes": "import ctypes\nctypes.string_at(0)\n",
    "hangs": "import time\ntime.sleep(600)\n",
}


opdiff = functools.partial(run, timeout=300)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Size and mtime of every file outside the stores."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in STORES and d != "__pycache__"]
        for name in filenames:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mtime_ns)
    return out


def clean(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    text = result.stdout + result.stderr
    assert result.returncode == code, text
    assert "Traceback" not in text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "s.yaml").write_text(SUITE)
    (tmp_path / "suites" / "mods.py").write_text(BLOCK)
    return tmp_path


@pytest.fixture
def recorded(project: Path) -> Path:
    clean(opdiff(project, "record", "-j", "1"), 0, "2 RECORDED")
    return project


# ---------------------------------------------------------------- a golden is data

def _tamper(root: Path, command: str) -> None:
    """What an attacker with write access to the store does: make the `neg` golden call
    os.system, and recompute its spec hash so nothing looks stale."""
    meta_path = root / "goldens" / store_key("neg", 0) / "zarr.json"
    meta = json.loads(meta_path.read_text())
    attrs = meta["attributes"]
    attrs["definition"]["call"] = {"kind": "module", "target": "os.system", "impl": None,
                                   "args": [{"type": "const", "value": command}], "kwargs": {}}
    attrs["test_type"] = "module"                 # consistent everywhere, as a careful attacker makes it
    attrs["spec_hash"] = spec_hash(attrs["definition"], ())
    meta_path.write_text(json.dumps(meta))


@pytest.mark.slow
def test_a_tampered_golden_runs_no_command(recorded: Path):
    marker = recorded / "PWNED"
    _tamper(recorded, f"touch {marker}")
    (recorded / "suites").rename(recorded / "elsewhere")   # goldens only: no suite vouches for it
    before = snapshot(recorded)
    # every record is consistent, so verify has nothing to report, and it runs nothing either
    assert "Traceback" not in opdiff(recorded, "goldens", "verify").stderr and not marker.exists()
    refused = opdiff(recorded, "check", "-b", "torch_cpu_fp32")
    clean(refused, 2, "'neg' seed 0: os.system", "A golden store is data", "--trust-goldens")
    for command in (("repro", "neg", "-b", "torch_cpu_fp32", "-o", "r.py"),
                    ("localize", "neg", "-b", "torch_cpu_fp32"),
                    ("goldens", "reference", "--force")):
        result = opdiff(recorded, *command)
        assert "os.system" in result.stdout + result.stderr and result.returncode != 0, command
        assert "Traceback" not in result.stdout + result.stderr
    # trusting the store imports os.system in a worker, which refuses to call a builtin
    trusted = opdiff(recorded, "check", "-b", "torch_cpu_fp32", "--trust-goldens", "--format", "json")
    assert trusted.returncode == 1, trusted.stderr
    assert "note: --trust-goldens: the workers of this check import os.system" in trusted.stderr
    result = {r["id"]: r for r in json.loads(trusted.stdout)["results"]}["neg"]
    assert result["status"] == "EXPORT_FAIL" and "'os.system' names a builtin" in result["message"]
    assert not marker.exists()
    assert snapshot(recorded) == before


def test_a_builtin_named_by_a_suite_is_refused_before_anything_runs(project: Path):
    marker = project / "PWNED"
    (project / "suites" / "s.yaml").write_text(
        "tests:\n  - {id: cmd, op: {type: module, path: os.system, "
        f"args: [{{type: const, value: 'touch {marker}'}}]}},"
        " in: []}\n")
    for command in ("validate", "record"):
        clean(opdiff(project, command), 2, "'os.system' names a builtin")
    assert not marker.exists() and not (project / "goldens").exists()


# ---------------------------------------------------------------- user code in workers only

@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(AT_IMPORT))
def test_a_module_that_misbehaves_at_import_fails_its_tests_only(project: Path, how: str):
    (project / "suites" / "mods.py").write_text(AT_IMPORT[how] + BLOCK)
    before = snapshot(project)
    # validation parses the file and never runs it...
    clean(opdiff(project, "validate"), 0, "ok: 2 tests")
    # ...and with --imports asks a worker, whose fate it reports
    expected = {"exits": "it exits at import: SystemExit: 3", "exits_zero": "exited with code 0",
                "crashes": "SIGSEGV", "hangs": "it hangs"}[how]
    clean(opdiff(project, "validate", "--imports", "--timeout-s", "5"), 2, "file:mods.py::Block", expected)
    # record: the test that imports it fails, the other is recorded, and the exit code says so
    record = opdiff(project, "record", "--timeout-s", "5", "-j", "1", "--format", "json")
    clean(record, 1)
    status = {r["id"]: (r["status"], r["message"]) for r in json.loads(record.stdout)["results"]}
    assert status["neg"][0] == "RECORDED"
    assert status["user"][0] == "BASELINE_FAIL"
    verdict = {"exits": "INFER_FAIL", "exits_zero": "CRASH", "crashes": "CRASH", "hangs": "TIMEOUT"}[how]
    assert verdict in status["user"][1]
    assert sorted(k.key for k in GoldenStore(project / "goldens").index()) == [store_key("neg", 0)]
    assert snapshot(project) == before


@pytest.mark.slow
def test_a_module_returning_nothing_is_a_failure_never_a_pass(project: Path):
    (project / "suites" / "mods.py").write_text(BLOCK.replace("return x * 2", "x.mul_(2)"))
    record = opdiff(project, "record", "--format", "json")
    clean(record, 1)
    user = {r["id"]: r for r in json.loads(record.stdout)["results"]}["user"]
    assert user["status"] == "BASELINE_FAIL" and "returns None: nothing to compare" in user["message"]


# ---------------------------------------------------------------- resume

@pytest.mark.slow
def test_resume_with_another_selection_suite_or_seeds_is_refused(recorded: Path):
    first = opdiff(recorded, "check", "-b", "torch_cpu_fp32", "--format", "json")
    clean(first, 0)
    run_id = json.loads(first.stdout)["run_id"]
    path = recorded / "store" / "runs" / f"{run_id}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2]))              # killed after one item
    before = path.read_bytes()
    for extra, fragment in ((("--test-ids", "neg"), "test_ids [] then, ['neg'] now"),
                            (("--seed-list", "0,1"), "seed_list [] then, [0, 1] now"),
                            (("--seeds", "2"), "seeds None then, 2 now")):
        clean(opdiff(recorded, "check", "-b", "torch_cpu_fp32", *extra, "--resume", run_id), 2,
              "planned something else", fragment)
    (recorded / "suites" / "s.yaml").write_text(SUITE.replace("shape: [2, 3]", "shape: [3, 3]", 1))
    clean(opdiff(recorded, "check", "-b", "torch_cpu_fp32", "--resume", run_id), 2,
          "1 test(s) changed since (spec hash: neg seed 0)")
    assert path.read_bytes() == before
    runs = opdiff(recorded, "runs")
    assert "resumable" in runs.stdout
