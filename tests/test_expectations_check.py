"""`opdiff check` held to an expectations file, through the real CLI: known failures pass
the run, a new one fails it naming the test, an expected failure that passes fails it as an
unexpected pass, `--update-expectations` rewrites exactly those entries, a malformed file
stops everything; and the README's main job exits 0 on the shipped suites and the shipped
expectations. The failures are planted with the perturbing test backend
(helpers/check/opdiff_perturb.py) on goldens recorded here."""

from __future__ import annotations

import difflib
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.check import opdiff, perturbed_ids, plugin_installed
from helpers.cli import MODULE, run

from opdiff_snap import api
from opdiff_snap.history.runs import read_run

ROOT = Path(__file__).resolve().parent.parent
PRESET = "perturb_cpu_fp32"
FAST = ["--repeats", "1", "--warmup", "0", "--in-process"]

pytest_plugins = ["helpers.check.project30"]


def _perturb(*ops: str) -> list[str]:
    return ["-b", PRESET, "--preset-options", f"{PRESET}=" + json.dumps({"perturb": list(ops), "delta": 0.5})]


def _tables(text: str) -> dict[str, list[list[str]]]:
    """The Markdown's tables, parsed by markdown-it (CommonMark with tables): {first header
    cell: body rows}, the rows of tables with the same first header joined."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    out: dict[str, list[list[str]]] = {}
    head, rows, in_head = "", [], False
    row: list[str] | None = None
    for t in tokens:
        if t.type == "thead_open":
            in_head, rows = True, []
        elif t.type == "thead_close":
            in_head = False
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append(t.content.strip("`"))
        elif t.type == "tr_close":
            cells, row = row or [], None
            if in_head:
                head = cells[0]
            else:
                rows.append(cells)
        elif t.type == "table_close":
            out.setdefault(head, []).extend(rows)
    return out


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.slow
def test_known_failures_pass_new_ones_and_unexpected_passes_fail_and_an_update_settles_them(site, project):
    broken = perturbed_ids(project)
    path = project / "expectations.yaml"
    # no file yet: a run that breaks exp and tanh writes what it saw
    proc = opdiff(project, site, "check", *_perturb("aten::exp", "aten::tanh"), *FAST, "--update-expectations")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"({len(broken)} added, 0 changed, 0 removed)" in proc.stdout
    with plugin_installed(site):
        written = api.load_expectations(path)
    assert {(e.preset, e.test, e.verdict.value, e.seed) for e in written.entries} == {
        (PRESET, t, "MISMATCH", None) for t in broken}
    # the same failures again: expected, the run passes; history and JUnit say so
    proc = opdiff(project, site, "check", *_perturb("aten::exp", "aten::tanh"), *FAST, "--junit", "j.xml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(broken)} expected, 0 new, 0 different, 0 unexpected passes; the run passes" in proc.stdout
    run = read_run(sorted((project / "store" / "runs").glob("*.jsonl"))[-1])
    assert {i["id"] for i in run.items if i["expected"] is not None} == broken
    assert all(i["expected"] == i["status"] for i in run.items if i["expected"] is not None)
    cases = ET.parse(project / "j.xml").getroot().iter("testcase")
    skipped = {c.get("name").split("[")[0] for c in cases if c.find("skipped") is not None}
    assert skipped == broken
    # a failure planted in a test nothing expects: the run fails, naming that test, first in
    # the Markdown summary too
    proc = opdiff(project, site, "check", *_perturb("aten::exp", "aten::tanh", "aten::sin"), *FAST,
                  "--summary-md", "summary.md")
    assert proc.returncode == 1 and "new failures (nothing expected them): 1" in proc.stdout
    assert "MISMATCH sin seed=0 perturb_cpu_fp32" in proc.stdout
    _no_traceback(proc)
    tables = _tables((project / "summary.md").read_text())
    assert tables["preset"][0][0] == PRESET and tables["preset"][0][-1] == f"{100 * (32 - len(broken) - 1) / 32:.1f} %"
    assert [row[:4] for row in tables["test"][0:1]] == [["sin", "0", PRESET, "MISMATCH"]]
    assert "opdiff repro sin -b perturb_cpu_fp32 --seed 0" in tables["test"][0][5]
    assert {row[0] for row in tables["test"][1:]} == broken    # the expected ones, folded, with no cause
    # the cause gone: every expected failure passes, which fails the run (strict) ...
    before = path.read_text()
    proc = opdiff(project, site, "check", *_perturb(), *FAST)
    assert proc.returncode == 1, proc.stdout
    assert f"unexpected passes (a failure was expected): {len(broken)}" in proc.stdout
    assert "PASS (expected MISMATCH) exp seed=0" in proc.stdout and "--update-expectations" in proc.stdout
    # ... or only warns, where the project says so
    (project / "pyproject.toml").write_text("[tool.opdiff]\nstrict_expectations = false\n")
    proc = opdiff(project, site, "check", *_perturb(), *FAST)
    assert proc.returncode == 0 and "strict_expectations is off" in proc.stdout
    (project / "pyproject.toml").unlink()
    # the update removes exactly those entries, and the next run passes
    proc = opdiff(project, site, "check", *_perturb(), *FAST, "--update-expectations")
    assert proc.returncode == 0 and f"(0 added, 0 changed, {len(broken)} removed)" in proc.stdout
    diff = [d for d in difflib.unified_diff(before.splitlines(), path.read_text().splitlines(), lineterm="", n=0)
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    assert sorted(diff) == sorted([f"-  - {{test: {t}, verdict: MISMATCH}}" for t in broken]
                                  + [f"-{PRESET}:"])      # the preset goes with its last entry
    assert opdiff(project, site, "check", *_perturb(), *FAST).returncode == 0


def test_a_malformed_expectations_file_is_refused_before_anything_runs(site, project):
    (project / "expectations.yaml").write_text(
        "perturb_cpu_fp23:\n  - {test: exp, verdict: MISMATCH}\n"
        "perturb_cpu_fp32:\n  - {test: exp, verdict: MISMATCHED}\n  - {test: \"t[\", verdict: CRASH}\n"
        "  - {test: sin, verdict: CRASH, until: \"torch<<2\"}\n  - {test: cos, verdict: CRASH}\n"
        "  - {test: cos, verdict: TIMEOUT}\n")
    runs = set((project / "store" / "runs").glob("*.jsonl"))
    proc = opdiff(project, site, "check", *_perturb(), *FAST)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "5 problems in the expectations file (nothing ran)" in proc.stderr
    for line, word in ((1, "unknown preset"), (4, "MISMATCHED"), (5, "glob"), (6, "version range"),
                       (8, "duplicate")):
        assert any(f"expectations.yaml:{line}:" in row and word in row for row in proc.stderr.splitlines()), \
            (line, word, proc.stderr)
    _no_traceback(proc)
    assert set((project / "store" / "runs").glob("*.jsonl")) == runs
    # an --expectations file that does not exist is the user's mistake too
    proc = opdiff(project, site, "check", *_perturb(), *FAST, "--expectations", "nowhere.yaml")
    assert proc.returncode == 2 and "nowhere.yaml" in proc.stderr
    os.mkfifo(project / "pipe.yaml")
    for update in ((), ("--update-expectations",)):       # a pipe: neither read (forever) nor written
        proc = opdiff(project, site, "check", *_perturb(), *FAST, "--expectations", "pipe.yaml", *update)
        assert proc.returncode == 2 and "pipe.yaml: not a regular file" in proc.stderr, proc.stderr
        _no_traceback(proc)
    assert set((project / "store" / "runs").glob("*.jsonl")) == runs


def _shipped_on_hand_written(preset: str) -> list:
    """The shipped expectations of `preset` on the tests of suites/*.yaml (the file also
    holds those of the OpInfo and zoo suites)."""
    from opdiff_snap.suite import load_suites

    ids = {c.id for c in load_suites(sorted((ROOT / "suites").glob("*.yaml")))}
    return [e for e in api.load_expectations(ROOT / "expectations.yaml").entries
            if e.preset == preset and e.test in ids]


@pytest.mark.slow
def test_the_shipped_known_failures_passing_fail_the_run_until_the_file_is_updated(site, tmp_path):
    """ONNX Runtime's shipped known failures held against a backend that computes each of
    those tests as torch does (the perturbing backend, nothing perturbed), on the shipped
    goldens: every one is an unexpected pass; the update removes exactly those entries."""
    import dataclasses

    from opdiff_snap.expectations.entries import Expectations
    from opdiff_snap.expectations.file import dump

    shipped = _shipped_on_hand_written("onnx_cpu_fp32")
    path = tmp_path / "expectations.yaml"
    path.write_text(dump(Expectations([dataclasses.replace(e, preset=PRESET) for e in shipped])))
    before = path.read_text()
    suites = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "suites").glob("*.yaml"))
    args = ["--store", str(tmp_path / "store"), "--cache", str(tmp_path / "cache"), "check", *suites, *_perturb(),
            *FAST, "--expectations", str(path), *[a for e in shipped for a in ("--test-ids", e.test)]]
    proc = opdiff(ROOT, site, *args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"unexpected passes (a failure was expected): {len(shipped)}" in proc.stdout
    proc = opdiff(ROOT, site, *args, "--update-expectations")
    assert proc.returncode == 0 and f"(0 added, 0 changed, {len(shipped)} removed)" in proc.stdout
    diff = [d for d in difflib.unified_diff(before.splitlines(), path.read_text().splitlines(), lineterm="", n=0)
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    assert sorted(diff) == sorted(["-" + line for line in before.splitlines()[3:]])   # every entry, and the preset
    assert opdiff(ROOT, site, *args).returncode == 0


@pytest.mark.slow
def test_the_readme_main_job_exits_0_on_the_shipped_suites_and_expectations(tmp_path):
    """As the README runs it (from the repository, ONNX Runtime on suites/*.yaml), with a
    store and cache of its own."""
    suites = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "suites").glob("*.yaml"))
    env = {**os.environ, "COLUMNS": "200"}
    proc = run(ROOT, "--store", str(tmp_path / "store"), "--cache", str(tmp_path / "cache"), "check",
               "--backend", "onnx_cpu_fp32", *suites, "-j", "2", entry=MODULE, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shipped = _shipped_on_hand_written("onnx_cpu_fp32")
    assert f"{len(shipped)} expected, 0 new, 0 different, 0 unexpected passes" in proc.stdout
    assert all(e.reason for e in shipped)     # each says why
    # a failure planted in a shipped test (its tolerance taken to zero): exit 1, naming it
    proc = run(ROOT, "--store", str(tmp_path / "store"), "--cache", str(tmp_path / "cache"), "check",
               "--backend", "onnx_cpu_fp32", *suites, "--test-ids", "cumsum_large", "--atol", "0", "--rtol", "0",
               "--baseline-factor", "0", entry=MODULE, env=env, timeout=600)
    assert proc.returncode == 1 and "new failures (nothing expected them): 1" in proc.stdout
    assert "MISMATCH cumsum_large seed=0 onnx_cpu_fp32" in proc.stdout
    # held to no expectation, every one of them is new, with its cause; an op test's cause
    # names the test's own line in its suite, not opdiff's code
    (tmp_path / "none.yaml").write_text("")
    proc = run(ROOT, "--store", str(tmp_path / "store"), "--cache", str(tmp_path / "cache"), "check",
               "--backend", "onnx_cpu_fp32", *suites, *[a for e in shipped for a in ("--test-ids", e.test)],
               "-j", "2", "--expectations", str(tmp_path / "none.yaml"), "--summary-md", str(tmp_path / "s.md"),
               entry=MODULE, env=env, timeout=1200)
    assert proc.returncode == 1
    rows = {r[0]: r for r in _tables((tmp_path / "s.md").read_text())["test"]}
    assert set(rows) <= {e.test for e in shipped} and len(rows) == min(50, len(shipped))   # the summary shows 50
    assert "erfinv" in rows
    from opdiff_snap.suite.load import line_of_test

    assert f"core_aten.yaml:{line_of_test(ROOT / 'suites' / 'core_aten.yaml', 'erfinv')})" in rows["erfinv"][4]
    assert "prepare.py" not in rows["erfinv"][4]
