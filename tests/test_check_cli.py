"""`opdiff check` end to end through the real CLI in subprocesses: a third-party backend
registered by entry point, JSON / JUnit output, exit codes, SIGKILL then --resume."""

from __future__ import annotations

import json
import os
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.check import opdiff, opdiff_popen, perturbed_ids

from opdiff_snap.history.runs import read_run

PERTURB = ["perturb_cpu_fp32", '{"perturb": ["aten::exp", "aten::tanh"]}']
FAST = ["--repeats", "1", "--warmup", "0"]

pytest_plugins = ["helpers.check.project30"]


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_entry_point_backend_mismatches_exactly_the_perturbed_ops(site, project):
    """Isolated workers, -j 2, a plugin preset with options: exactly the perturbed ops mismatch."""
    proc = opdiff(project, site, "check", "-b", PERTURB[0], "--preset-options", "=".join(PERTURB),
                  "-j", "2", *FAST, "--format", "json", "--junit", "out/junit.xml")
    no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    status = {r["id"]: r["status"] for r in report["results"]}
    assert len(status) == len(report["results"]) == 32
    expected = perturbed_ids(project)
    assert expected == {"exp", "tanh", "tanh_module"}
    assert {i for i, s in status.items() if s == "MISMATCH"} == expected
    assert {i for i, s in status.items() if s != "MISMATCH"} == set(status) - expected
    assert set(status.values()) == {"MISMATCH", "PASS"}
    for r in report["results"]:
        if r["status"] == "MISMATCH":
            assert abs(r["metrics"]["max_abs"] - 1e-2) < 1e-6 and r["metrics"]["mismatched"] == 24

    run = read_run(Path(report["history"]) if Path(report["history"]).is_absolute()
                   else project / report["history"])
    assert run.complete and run.end["counts"] == {"MISMATCH": 3, "PASS": 29}
    assert run.meta["presets"]["perturb_cpu_fp32"]["options"]["perturb"] == ["aten::exp", "aten::tanh"]
    assert run.meta["settings"]["jobs"] == 2 and run.meta["settings"]["in_process"] is False
    assert {i["baseline"] for i in run.items} == {"torch_cpu_fp32"}

    root = ET.parse(project / "out" / "junit.xml").getroot()
    assert root.tag == "testsuites"
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == 32 and len({c.get("name") for c in cases}) == 32
    failed = {c.get("name") for c in cases if c.find("failure") is not None}
    assert failed == {f"{i}[seed=0]" for i in expected}
    suite = root.find("testsuite")
    assert suite.get("name") == "perturb_cpu_fp32" and suite.get("tests") == "32" and suite.get("failures") == "3"


@pytest.mark.slow
def test_exit_codes_fail_on_json_and_junit(site, project):
    ok = opdiff(project, site, "check", "-b", "torch_cpu_fp32", "--in-process", *FAST,
                "--junit", "j.xml", "--test-ids", "exp;add*")
    no_traceback(ok)
    assert ok.returncode == 0, ok.stderr
    assert "3 PASS" in ok.stdout and "history: store/runs/" in ok.stdout
    assert ok.stdout.startswith("[1/3] PASS")   # plain lines with the total when not a terminal
    cases = ET.parse(project / "j.xml").getroot().findall("./testsuite/testcase")
    assert sorted(c.get("name") for c in cases) == ["add[seed=0]", "add_int[seed=0]", "exp[seed=0]"]
    args = ["check", "-b", PERTURB[0], "--preset-options", "=".join(PERTURB), "--in-process", *FAST,
            "--tags", "unary", "--format", "json"]
    bad = opdiff(project, site, *args)
    assert bad.returncode == 1 and json.loads(bad.stdout)["counts"] == {"MISMATCH": 2, "PASS": 12}
    assert opdiff(project, site, *args, "--fail-on", "STALE,CORRUPT").returncode == 0
    assert opdiff(project, site, *args, "--fail-on", "mismatch").returncode == 1


def test_unknown_preset_exits_2_with_a_suggestion(site, project):
    proc = opdiff(project, site, "check", "-b", "torch_cpu_fp23", "--in-process")
    assert proc.returncode == 2 and "'torch_cpu_fp32'" in proc.stderr and "unknown backend preset" in proc.stderr
    no_traceback(proc)
    assert proc.stdout == ""


@pytest.mark.slow
def test_usage_and_input_errors_exit_2_without_traceback(site, project):
    proc = opdiff(project, site, "check", "-b", "torch_cpu_fp32", "--fail-on", "MISMATCHH")
    assert proc.returncode == 2 and "MISMATCH" in proc.stderr
    no_traceback(proc)
    proc = opdiff(project, site, "check", "-b", "perturb_cpu_fp32", "--preset-options",
                  'perturb_cpu_fp32={"perturbb": []}')
    assert proc.returncode == 2 and "unknown option 'perturbb'" in proc.stderr
    no_traceback(proc)
    suite = project / "suites" / "suite30.yaml"
    suite.write_text(suite.read_text().replace("  - {id: exp, op: aten::exp.default, in:",
                                               "  - {id: exp, op: aten::exp.default, inn:"))
    proc = opdiff(project, site, "check", "-b", "torch_cpu_fp32", "--in-process")
    assert proc.returncode == 2 and "suite30.yaml" in proc.stderr and "'inn'" in proc.stderr
    no_traceback(proc)
    # none of these started a check run (the one run is the fixture's record)
    assert [read_run(p).meta["command"] for p in (project / "store" / "runs").glob("*.jsonl")] == ["record"]


def _items(path: Path) -> int:
    try:
        return sum(1 for line in path.read_bytes().splitlines() if b'"type": "item"' in line)
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_every_item_exactly_once(site, project):
    hold = project / "hold"   # jobs past the sixth wait for hold/open: the kill always lands mid-run
    held = json.dumps({"perturb": ["aten::exp", "aten::tanh"], "hold_dir": str(hold), "hold_after": 6})
    args = ["-b", PERTURB[0], "--preset-options", f"{PERTURB[0]}={held}", "-j", "2", *FAST]
    runs = project / "store" / "runs"
    before = set(runs.glob("*.jsonl"))   # the fixture's record run
    proc = opdiff_popen(project, site, "check", *args)
    deadline = time.monotonic() + 240
    path = None
    try:
        while time.monotonic() < deadline:
            files = list(set(runs.glob("*.jsonl")) - before)
            if files and _items(files[0]) >= 6:
                path = files[0]
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert path is not None, "no items appeared"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the check and the workers it spawned
        proc.communicate()
    killed = read_run(path)
    assert not killed.complete and 6 <= len(killed.items) < 32

    (hold / "open").touch()
    run_id = path.stem
    resumed = opdiff(project, site, "check", *args, "--resume", run_id, "--format", "json", "--junit", "j.xml")
    no_traceback(resumed)
    assert resumed.returncode == 1, resumed.stderr
    run = read_run(path)
    keys = [(i["id"], i["seed"], i["preset"]) for i in run.items]
    assert len(keys) == len(set(keys)) == 32
    assert run.complete and run.end["resumed"] == len(killed.items)
    assert run.end["counts"] == {"MISMATCH": 3, "PASS": 29}
    assert {k for k in keys if run.items[keys.index(k)]["status"] == "MISMATCH"} == \
        {(i, 0, "perturb_cpu_fp32") for i in perturbed_ids(project)}
    # the report (JSON, JUnit) covers the whole run, not only the resumed part
    assert len(json.loads(resumed.stdout)["results"]) == 32
    assert len(ET.parse(project / "j.xml").getroot().findall("./testsuite/testcase")) == 32
    # resuming a complete run is refused
    again = opdiff(project, site, "check", *args, "--resume", run_id)
    assert again.returncode == 2 and "complete" in again.stderr
