"""The results page (analytics/shipped_results.py, tools/results_page.py): the page it
regenerates keeps the hand-written blocks, says where a result is not what the expectations
file expects, and never carries a failure without a reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from opdiff_snap.analytics.coverage_section import coverage_lines
from opdiff_snap.analytics.shipped_results import Latest, write_page
from opdiff_snap.expectations.known import Known, page_presets
from opdiff_snap.expectations.reasons import UNTRIAGED

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def test_regenerating_the_page_keeps_marked_blocks(tmp_path):
    page = tmp_path / "results.md"
    block = "<!-- kept: localize -->\n## Where inside the models\n\nfindings\n<!-- end kept: localize -->"
    page.write_text(f"# old page\n\n## some_preset\n\nold rows\n\n{block}\n")
    write_page({("t", "p"): Latest("MISMATCH", "m")}, [], ["p"], page)
    text = page.read_text()
    assert "old rows" not in text and "## p" in text    # regenerated...
    assert text.rstrip().endswith(block)                # ...with the block kept, at the end, once
    write_page({("t", "p"): Latest("PASS")}, [], ["p"], page)
    assert page.read_text().count("<!-- kept: localize -->") == 1


def test_results_the_expectations_file_does_not_expect_are_named(tmp_path):
    page = tmp_path / "results.md"
    results = {("a", "p"): Latest("EXPORT_FAIL", "x", expected="EXPORT_FAIL"),   # known
               ("b", "p"): Latest("MISMATCH", "y"),                               # new
               ("c", "p"): Latest("INFER_FAIL", "z", expected="EXPORT_FAIL"),     # another failure
               ("d", "p"): Latest("PASS", expected="MISMATCH"),                   # fixed
               ("e", "q"): Latest("PASS")}
    unexplained = write_page(results, [], ["p", "q"], page)
    text = page.read_text()
    assert unexplained == 3
    assert "| 1 different failure, 1 new failure, 1 unexpected pass |" in text
    assert "| as expected |" in text
    assert "`b` (new failure)" in text and "`c` (different failure)" in text and "`d` (unexpected pass)" in text
    assert "`a` (" not in text


def test_coverage_counts_known_failures_and_flags_untriaged_ones():
    known = [Known("opinfo", "opinfo.exp.f32.0", "p", None, ""),
             Known("opinfo", "opinfo.exp.f16.0", "p", "MISMATCH", "tolerance choice: half"),
             Known("opinfo", "opinfo.exp.f32.0@subnormal", "p", "MISMATCH", "backend limit: flushed"),
             Known("opinfo", "opinfo.log.bf16.0", "p", "EXPORT_FAIL", f"{UNTRIAGED}: boom"),
             Known("zoo", "zoo_gpt2", "p", "MISMATCH", ""),
             Known("zoo", "zoo_bert", "p", None, "")]
    lines, unreasoned = coverage_lines(known, ["p"])
    text = "\n".join(lines)
    assert unreasoned == 2          # the untriaged one and the one with no reason at all
    assert "| p | 4 | 2 | 1 | 1 | 2 |" in text                      # tests, ops, no entry, EXPORT_FAIL, MISMATCH
    assert "| p | 1 | 0 | 0 | 0 |" in text                          # no entry per kind: only float32 passes
    assert "UNEXPLAINED, not triaged yet: boom" in text
    assert "| `zoo_gpt2` | MISMATCH | UNEXPLAINED: no reason written |" in text


def _run_file(path: Path, items: list[tuple[str, str, str, str]]) -> Path:
    lines = [{"type": "meta", "run_id": "r1", "command": "check", "started": "2026-01-01T00:00:00Z"}]
    lines += [{"type": "item", "run_id": "r1", "id": test, "seed": 0, "preset": preset, "status": status,
               "error_message": message} for preset, test, status, message in items]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_reasons_are_filled_from_rules_and_refreshed_only_where_a_rule_wrote_them(tmp_path):
    """An empty or untriaged reason is filled from the first rule that explains the result;
    --refresh re-derives a reason a rule wrote, never one written by hand."""
    notes = tmp_path / "notes.yaml"
    notes.write_text('- {preset: "onnx_*", test: "a*", status: MISMATCH, kind: upstream-bug, why: "new cause. More."}\n'
                     '- {preset: "onnx_*", status: MISMATCH, kind: tolerance, why: "catch-all"}\n')
    exps = tmp_path / "expectations.yaml"
    exps.write_text("onnx_cpu_fp32:\n"
                    "  - {test: a1, verdict: MISMATCH}\n"
                    "  - {test: a2, verdict: MISMATCH, reason: 'not triaged yet: boom'}\n"
                    "  - {test: a3, verdict: MISMATCH, reason: 'tolerance choice: catch-all'}\n"
                    "  - {test: a4, verdict: MISMATCH, reason: 'written by hand: the ONNX notes'}\n"
                    "  - {test: b1, verdict: MISMATCH}\n")
    run = _run_file(tmp_path / "run.jsonl", [("onnx_cpu_fp32", t, "MISMATCH", "m") for t in ("a1", "a2", "a3", "a4", "b1")])
    tool = TOOLS / "expectation_reasons.py"

    def reasons(*flags: str) -> dict[str, str]:
        subprocess.run([sys.executable, str(tool), "--expectations", str(exps), "--notes", str(notes), *flags,
                        str(run)], check=True, capture_output=True)
        return {e["test"]: e.get("reason", "") for e in yaml.safe_load(exps.read_text())["onnx_cpu_fp32"]}

    once = reasons()
    assert once["a1"] == once["a2"] == "bug worth reporting upstream: new cause"
    assert once["a3"] == "tolerance choice: catch-all"      # a reason written is kept...
    assert once["b1"] == "tolerance choice: catch-all"
    refreshed = reasons("--refresh")
    assert refreshed["a3"] == "bug worth reporting upstream: new cause"   # ...unless --refresh and a rule wrote it
    assert refreshed["a4"] == "written by hand: the ONNX notes"


def test_the_page_checks_every_cpu_preset_and_two_coreml_conversions():
    """The page's presets come from the registry: the 22 of docs/results.md."""
    presets = page_presets()
    assert len(presets) == 22 and presets[0] == "torch_cpu_fp32"
    assert presets[-2:] == ["coreml_any_fp32", "coreml_any_fp16"]
    assert not [p for p in presets if "cuda" in p or "mps" in p or "coreml" in p.split("_")[1]]


def test_a_known_failure_that_blames_the_test_fails_the_page(tmp_path):
    """A known failure describes a backend or a tolerance choice: an entry whose reason is of
    kind test design stops the page (exit non-zero, the entry named), and a notes rule of that
    kind is refused; the same entry with a backend's reason goes through."""
    page = tmp_path / "results.md"
    page.write_text("# page\n")
    exps = tmp_path / "expectations.yaml"

    def page_run(reason: str) -> subprocess.CompletedProcess:
        exps.write_text(f"onnx_cpu_fp16:\n  - {{test: isclose, verdict: MISMATCH, reason: '{reason}'}}\n")
        return subprocess.run([sys.executable, str(TOOLS / "results_page.py"), "--coverage-only", "--expectations",
                               str(exps), "-o", str(page)], capture_output=True, text=True)

    blamed = page_run("test design: closeness is a threshold")
    assert blamed.returncode != 0
    assert "onnx_cpu_fp16: isclose" in blamed.stderr and "blames the test" in blamed.stderr
    assert "Traceback" not in blamed.stderr
    assert page_run("backend limit: ONNX Runtime rounds first").returncode == 0

    notes = tmp_path / "notes.yaml"
    notes.write_text('- {preset: "*16", test: isclose, status: MISMATCH, kind: test-design, why: "a threshold"}\n')
    run = _run_file(tmp_path / "run.jsonl", [("onnx_cpu_fp16", "isclose", "MISMATCH", "m")])
    filled = subprocess.run([sys.executable, str(TOOLS / "expectation_reasons.py"), "--expectations", str(exps),
                             "--notes", str(notes), str(run)], capture_output=True, text=True)
    assert filled.returncode != 0 and "rule 0 (isclose on *16)" in filled.stderr
    assert "Traceback" not in filled.stderr
