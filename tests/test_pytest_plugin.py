"""The pytest plugin, through pytest's own `pytester`: real pytest sessions in subprocesses
with the plugin installed through its `pytest11` entry point, real worker processes, real
backends (torch, ONNX Runtime) and test backends registered as plugins
(helpers.check.opdiff_perturb, helpers.pytest.stages)."""

from __future__ import annotations

import json
import os
import shutil
import string
import textwrap
from pathlib import Path

import pytest
from helpers.pytest import CRASHY, TESTS, junit_cases, make_site, recorded_verdicts_project

from opdiff_snap.history.runs import read_run

pytest_plugins = ["pytester"]

SUITE = "suites.verdicts.yaml"     # JUnit classname of suites/verdicts.yaml's items
PERTURB_EXP = 'perturb_cpu_fp32={"perturb": ["aten::exp"]}'
# (JUnit classname::name) -> (outcome, text the failure or skip must hold)
EXPECTED = {
    f"{SUITE}::relu[s0-perturb_cpu_fp32]": ("passed", ""),
    f"{SUITE}::exp[s0-perturb_cpu_fp32]": ("failed", "MISMATCH on perturb_cpu_fp32"),
    f"{SUITE}::neg[s0-perturb_cpu_fp32]": ("skipped", "known gap on perturb (test)"),
    f"{SUITE}::scale[s0-perturb_cpu_fp32]": (
        "failed", "fix: opdiff record --baseline torch_cpu_fp32 --test-ids scale --seed-list 0"),
    f"{SUITE}::sin[s0-perturb_cpu_fp32]": ("failed", "CORRUPT on perturb_cpu_fp32"),
    f"{SUITE}::fresh[s0-perturb_cpu_fp32]": (
        "failed", "fix: opdiff record --baseline torch_cpu_fp32 --test-ids fresh --seed-list 0"),
    "goldens::gone[s0-perturb_cpu_fp32]": ("failed", "fix: opdiff goldens prune"),
    f"{SUITE}::relu[s0-stages_export_fp32]": ("failed", "EXPORT_FAIL on stages_export_fp32"),
    f"{SUITE}::relu[s0-stages_load_fp32]": ("failed", "LOAD_FAIL on stages_load_fp32"),
    f"{SUITE}::relu[s0-stages_infer_fp32]": ("failed", "INFER_FAIL on stages_infer_fp32"),
    f"{SUITE}::relu[s0-stages_crash_fp32]": ("failed", "SIGSEGV"),
    f"{SUITE}::relu[s0-stages_hang_fp32]": ("failed", "TIMEOUT on stages_hang_fp32"),
    f"{SUITE}::relu[s0-stages_absent_fp32]": ("skipped", "UNAVAILABLE on stages_absent_fp32"),
    f"{SUITE}::relu[s0-stages_fine_fp32]": ("passed", ""),
}
STAGES = ["export", "load", "infer", "crash", "hang", "absent", "fine"]
VERDICT_ARGS = ["--opdiff", "-b", "perturb_cpu_fp32", *[a for s in STAGES for a in ("-b", f"stages_{s}_fp32")],
                "--opdiff-preset-options", PERTURB_EXP, "-k", "perturb_cpu_fp32 or (relu and stages_)",
                "-p", "no:cacheprovider", "--junitxml", "junit.xml"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return make_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def verdicts_template(tmp_path_factory) -> Path:
    return recorded_verdicts_project(tmp_path_factory.mktemp("verdicts"))


@pytest.fixture
def env(site, monkeypatch):
    """The plugin and the test backends installed for pytester's subprocesses."""
    path = [str(site), str(TESTS), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def verdicts(pytester, verdicts_template, env) -> Path:
    shutil.copytree(verdicts_template, pytester.path, dirs_exist_ok=True)
    return pytester.path


def history_runs(root: Path) -> list:
    """The run files pytest sessions wrote (not the template's record run)."""
    runs = [read_run(p) for p in sorted((root / "store" / "runs").glob("*.jsonl"))]
    return [r for r in runs if r.meta.get("runner") == "pytest"]


def outcomes(result, root: Path) -> dict[str, tuple[str, str]]:
    cases = junit_cases(root / "junit.xml")
    for key, (outcome, text) in EXPECTED.items():
        assert key in cases, f"{key} missing from the JUnit file:\n{result.stdout.str()}"
        got, body = cases[key]
        assert got == outcome and text in body, f"{key}: {got} {body!r}"
    return cases


# ---------------------------------------------------------------- dormant

@pytest.mark.slow
def test_dormant_without_the_flag(pytester, verdicts, env):
    """Installed (entry point) but not asked: the session is the one pytest would run
    without the plugin; nothing heavy is imported, nothing is written."""
    pytester.makepyfile(test_plain="def test_ok():\n    assert 1 + 1 == 2\n")
    pytester.makeconftest(textwrap.dedent("""
        import json, sys

        def pytest_collection_finish(session):
            heavy = [m for m in ("torch", "opdiff_snap.run.check", "opdiff_snap.run.check_plan", "opdiff_snap.run.judge",
                                  "opdiff_snap.pytest_plugin.run") if m in sys.modules]
            with open("seen.json", "w") as f:
                json.dump({"heavy": heavy, "plugin": session.config.pluginmanager.hasplugin("opdiff"),
                           "items": [i.nodeid for i in session.items]}, f)
    """))
    runs_before = sorted((verdicts / "store" / "runs").iterdir())   # the record run of the template
    with_plugin = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    seen = json.loads((verdicts / "seen.json").read_text())
    without = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:opdiff")
    with_plugin.assert_outcomes(passed=1)
    without.assert_outcomes(passed=1)
    assert seen == {"heavy": [], "plugin": True, "items": ["test_plain.py::test_ok"]}
    # the plugin printed nothing: "opdiff" appears only where pytest names the distribution
    # that registered it (make_site's, in its header), whatever words pytest puts around that
    assert not any("opdiff" in line.replace("opdiff-pytest-test", "") for line in with_plugin.outlines)
    assert sorted((verdicts / "store" / "runs").iterdir()) == runs_before


# ---------------------------------------------------------------- collection

COLLECTED = """
import json

def pytest_collection_finish(session):
    with open("collected.json", "w") as f:
        json.dump([item.nodeid for item in session.items], f)
"""


def collected(pytester, *args: str):
    """The node ids a `--collect-only` session collected (after -m/-k), as a conftest hook
    records them rather than as pytest prints them; and the run's result."""
    pytester.makeconftest(COLLECTED)
    out = pytester.path / "collected.json"
    out.unlink(missing_ok=True)
    result = pytester.runpytest_subprocess("--collect-only", "-p", "no:cacheprovider", *args)
    assert out.is_file(), result.stdout.str() + result.stderr.str()
    return set(json.loads(out.read_text())), result

@pytest.mark.slow
def test_collection_ids_markers_and_where_items_come_from(pytester, verdicts):
    ids, result = collected(pytester, "--opdiff", "-b", "perturb_cpu_fp32", "-b", "stages_fine_fp32")
    tests = ["relu", "exp", "neg", "scale", "sin", "fresh"]
    expected = {f"suites/verdicts.yaml::{t}[s0-{p}]" for t in tests for p in ("perturb_cpu_fp32", "stages_fine_fp32")}
    expected |= {f"goldens::gone[s0-{p}]" for p in ("perturb_cpu_fp32", "stages_fine_fp32")}
    assert ids == expected, result.stdout.str()

    tagged, result = collected(pytester, "--opdiff", "-b", "perturb_cpu_fp32", "-m", "math", "-W", "error")
    assert tagged == {f"suites/verdicts.yaml::{t}[s0-perturb_cpu_fp32]" for t in ("exp", "sin", "fresh")}, \
        result.stdout.str()

    # enabled by the ini file; testpaths that do not reach the suites still get them, a
    # named path gets what it names
    (verdicts / "pyproject.toml").write_text((verdicts / "pyproject.toml").read_text() + textwrap.dedent("""
        [tool.pytest.ini_options]
        testpaths = ["tests"]
        opdiff = true
        opdiff_backends = ["perturb_cpu_fp32"]
    """))
    (verdicts / "tests").mkdir()
    (verdicts / "tests" / "test_plain.py").write_text("def test_ok():\n    pass\n")
    bare_ids, result = collected(pytester)
    assert "tests/test_plain.py::test_ok" in bare_ids, result.stdout.str()
    assert "suites/verdicts.yaml::relu[s0-perturb_cpu_fp32]" in bare_ids and len(bare_ids) == 8
    named, result = collected(pytester, "tests")
    assert named == {"tests/test_plain.py::test_ok"}, result.stdout.str()


@pytest.mark.slow
def test_bad_input_is_one_paragraph_and_exit_code_2(pytester, verdicts):
    result = pytester.runpytest_subprocess("--opdiff", "-b", "perturb_cpu_fp32x", "-p", "no:cacheprovider")
    assert result.ret == 2
    assert "opdiff: error: unknown backend preset 'perturb_cpu_fp32x'" in result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()

    (verdicts / "suites" / "broken.yaml").write_text("tests:\n  - {id: x, op: aten::nosuch.default, in: []}\n")
    result = pytester.runpytest_subprocess("--opdiff", "-b", "perturb_cpu_fp32", "-p", "no:cacheprovider")
    assert result.ret == 2
    out = result.stdout.str()
    assert "opdiff: error:" in out and "suites/broken.yaml" in out and "aten::nosuch" in out
    assert "Traceback" not in out


# ---------------------------------------------------------------- verdicts as outcomes

@pytest.mark.slow
def test_every_verdict_maps_to_its_outcome_and_junit_has_one_case_per_item(pytester, verdicts):
    result = pytester.runpytest_subprocess(*VERDICT_ARGS, timeout=300)
    result.assert_outcomes(passed=2, failed=10, skipped=2, deselected=7 * (1 + len(STAGES)) - len(EXPECTED))
    cases = outcomes(result, verdicts)
    assert len(cases) == len(EXPECTED)        # one testcase per item, nothing else
    failure = cases[f"{SUITE}::exp[s0-perturb_cpu_fp32]"][1]
    assert "max_abs=" in failure and "mismatched=" in failure   # our message and metrics
    assert "Traceback" not in result.stdout.str()
    # the segfault took down one worker, not pytest: the items after it ran
    runs = history_runs(verdicts)
    assert len(runs) == 1 and runs[0].complete
    run = runs[0]
    assert run.meta["runner"] == "pytest" and run.meta["command"] == "check" and run.meta["run_group"]
    assert {(i["id"], i["preset"]) for i in run.items} == {
        (k.split("::")[1].split("[")[0], k.split("-", 1)[1].rstrip("]")) for k in EXPECTED}
    assert run.end["counts"]["CRASH"] == 1 and run.end["counts"]["TIMEOUT"] == 1


@pytest.mark.slow
def test_expected_failures_are_strict_xfails_and_junit_skips_them_with_the_reason(pytester, verdicts):
    (verdicts / "expectations.yaml").write_text(
        "perturb_cpu_fp32:\n  - {test: exp, verdict: MISMATCH, reason: planted exp kernel}\n"
        "stages_export_fp32:\n  - {test: relu, verdict: EXPORT_FAIL, reason: no exporter}\n"
        "stages_fine_fp32:\n  - {test: relu, verdict: CRASH, reason: it used to crash}\n")
    args = [a if a != "perturb_cpu_fp32 or (relu and stages_)" else
            "(exp and perturb_cpu_fp32) or (relu and (stages_export or stages_fine))" for a in VERDICT_ARGS]
    result = pytester.runpytest_subprocess(*args, timeout=300)
    result.assert_outcomes(xfailed=2, failed=1, deselected=7 * (1 + len(STAGES)) - 3)
    cases = junit_cases(verdicts / "junit.xml")
    exp, export = cases[f"{SUITE}::exp[s0-perturb_cpu_fp32]"], cases[f"{SUITE}::relu[s0-stages_export_fp32]"]
    assert exp[0] == "skipped" and "MISMATCH on perturb_cpu_fp32, as expected: planted exp kernel" in exp[1]
    assert export[0] == "skipped" and "no exporter" in export[1]
    fine = cases[f"{SUITE}::relu[s0-stages_fine_fp32]"]
    assert fine[0] == "failed" and "unexpected pass" in fine[1] and "CRASH was expected" in fine[1]
    run = history_runs(verdicts)[0]      # the history keeps the verdict, and what was expected
    assert {(i["id"], i["preset"]): (i["status"], i["expected"]) for i in run.items} == {
        ("exp", "perturb_cpu_fp32"): ("MISMATCH", "MISMATCH"), ("relu", "stages_export_fp32"): ("EXPORT_FAIL",
                                                                                             "EXPORT_FAIL"),
        ("relu", "stages_fine_fp32"): ("PASS", "CRASH")}


@pytest.mark.slow
def test_xdist_gives_the_same_outcomes_with_one_history_run_per_worker(pytester, verdicts):
    result = pytester.runpytest_subprocess(*VERDICT_ARGS, "-n", "2", timeout=300)
    result.assert_outcomes(passed=2, failed=10, skipped=2)   # the same as without -n (previous test)
    outcomes(result, verdicts)
    runs = history_runs(verdicts)
    assert len(runs) == 2 and all(r.complete for r in runs)
    assert len({r.meta["run_group"] for r in runs}) == 1
    assert {r.meta["xdist_worker"] for r in runs} == {"gw0", "gw1"}
    keys = [(i["id"], i["preset"]) for r in runs for i in r.items]
    assert len(keys) == len(set(keys)) == len(EXPECTED)


# ---------------------------------------------------------------- the fixture

BLOCKS = """\
import torch


class MyBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def test_block(opdiff_golden):
    torch.manual_seed(0)
    opdiff_golden.check(MyBlock(), (torch.randn(3, 8),), backends=["torch_cpu_fp32", "onnx_cpu_fp32"])
"""
WRONG = """\
import torch


def test_wrong_tanh(opdiff_golden):
    torch.manual_seed(1)
    opdiff_golden.check(torch.nn.Tanh(), (torch.randn(2, 5),), backends=["perturb_cpu_fp32"])
"""


def section(result, header: str) -> list[str]:
    """The lines under one header of the session's `opdiff` summary."""
    lines, out, inside = result.outlines, [], False
    # the header pytest draws for the section our plugin names "opdiff", whatever it draws around the name
    start = next((i for i, x in enumerate(lines) if x.strip(string.punctuation + " ") == "opdiff"), len(lines))
    for line in lines[start:]:
        if line.startswith(header):
            inside = True
        elif inside and line.startswith("  "):
            out.append(line.strip())
        elif inside:
            break
    return out


@pytest.mark.slow
def test_fixture_records_passes_goes_stale_and_update_fixes_it(pytester, env):
    pytester.makepyprojecttoml("[tool.opdiff]\nrepeats = 1\nwarmup = 0\njobs = 1\n")
    tests = pytester.path / "tests"
    tests.mkdir()
    (tests / "test_blocks.py").write_text(BLOCKS)
    goldens = tests / "__goldens__"
    run = ("-p", "no:cacheprovider")

    first = pytester.runpytest_subprocess(*run)               # records, then checks
    first.assert_outcomes(passed=1)
    assert [x.split(" (")[0] for x in section(first, "goldens recorded on torch_cpu_fp32")] == [
        "tests/test_blocks.py::test_block"]
    [history] = history_runs(pytester.path)
    assert {(i["id"], i["preset"], i["status"]) for i in history.items} == {
        ("tests/test_blocks.py::test_block", "torch_cpu_fp32", "RECORDED"),   # the recording is its result
        ("tests/test_blocks.py::test_block", "onnx_cpu_fp32", "PASS")}

    (tests / "test_wrong.py").write_text(WRONG)
    second = pytester.runpytest_subprocess(*run, "--opdiff-preset-options",
                                           'perturb_cpu_fp32={"perturb": ["aten::tanh"]}')
    second.assert_outcomes(passed=1, failed=1)                # test_block passes on its golden
    assert [x.split(" (")[0] for x in section(second, "goldens recorded on torch_cpu_fp32")] == [
        "tests/test_wrong.py::test_wrong_tanh"]
    assert "MISMATCH on perturb_cpu_fp32" in second.stdout.str() and "max_abs=0.01" in second.stdout.str()

    (tests / "test_wrong.py").unlink()
    (tests / "test_blocks.py").write_text(BLOCKS.replace("torch.tanh(self.lin(x))", "torch.sigmoid(self.lin(x))"))
    stale = pytester.runpytest_subprocess(*run)
    stale.assert_outcomes(failed=1)
    text = stale.stdout.str()
    assert "STALE on torch_cpu_fp32, onnx_cpu_fp32" in text
    assert "the source of test_blocks.MyBlock changed since the golden was recorded" in text
    assert "fix: pytest --opdiff-update tests/test_blocks.py::test_block" in text
    # the deleted test's golden is unused; the failing test keeps its own
    assert section(stale, "unused goldens") == ["tests/test_wrong.py::test_wrong_tanh (its test is gone)"]

    updated = pytester.runpytest_subprocess(*run, "--opdiff-update")
    updated.assert_outcomes(passed=1)
    assert [x.split(" (")[0] for x in section(updated, "goldens re-recorded on torch_cpu_fp32")] == [
        "tests/test_blocks.py::test_block"]
    assert section(updated, "unused goldens pruned") == ["tests/test_wrong.py::test_wrong_tanh (its test is gone)"]

    (tests / "test_blocks.py").write_text(BLOCKS.replace("def test_block(", "def test_block_renamed("))
    # keyed by node id: a renamed test records anew, and its old golden is pruned as unused
    pruned = pytester.runpytest_subprocess(*run, "--opdiff-update")
    pruned.assert_outcomes(passed=1)
    assert section(pruned, "unused goldens pruned") == ["tests/test_blocks.py::test_block (its test is gone)"]
    from opdiff_snap.goldens import GoldenStore
    assert [i.test_id for i in GoldenStore(goldens).index()] == ["tests/test_blocks.py::test_block_renamed"]


FP16_NORM = """\
import torch


def test_offset_norm(opdiff_golden):
    torch.manual_seed(0)
    x = 40 + 4 * torch.rand(8, 64)     # float16 keeps too few digits of these for the golden's tolerance
    opdiff_golden.check(torch.nn.LayerNorm(64), (x,), backends=["onnx_cpu_fp16"])
"""


@pytest.mark.slow
def test_fixture_judges_fp16_against_torchs_own_precision_as_check_does(pytester, env):
    pytester.makepyprojecttoml("[tool.opdiff]\nrepeats = 1\nwarmup = 0\njobs = 1\n")
    (pytester.path / "test_norm.py").write_text(FP16_NORM)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    [history] = history_runs(pytester.path)
    [item] = [i for i in history.items if i["preset"] == "onnx_cpu_fp16"]
    assert item["status"] == "PASS" and item["metrics"]["as_torch"] > 0
    assert item["metrics"]["torch_multiple"] <= item["metrics"]["torch_factor"]


@pytest.mark.slow
def test_fixture_segfault_fails_one_test_only(pytester, env):
    pytester.makepyprojecttoml("[tool.opdiff]\nrepeats = 1\nwarmup = 0\njobs = 1\n")
    shutil.copy(CRASHY, pytester.path / "crashy.py")
    pytester.makepyfile(test_crash=textwrap.dedent("""
        import torch
        from crashy import Scaled, Segfault

        def test_before(opdiff_golden):
            torch.manual_seed(0)
            opdiff_golden.check(Scaled(4), (torch.randn(2, 4),), backends=["torch_cpu_fp32"])

        def test_segfault(opdiff_golden):
            opdiff_golden.check(Segfault(), (torch.randn(2, 4),), backends=["torch_cpu_fp32"])

        def test_after(opdiff_golden):
            torch.manual_seed(1)
            opdiff_golden.check(Scaled(4), (torch.randn(2, 4),), backends=["torch_cpu_fp32"])

        def test_local_class_cannot_travel(opdiff_golden):
            class Local(torch.nn.Module):
                def forward(self, x):
                    return x
            opdiff_golden.check(Local(), (torch.randn(2),))
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=2, failed=2)
    cases = junit_cases(pytester.path / "junit.xml")
    assert {k: v[0] for k, v in cases.items()} == {
        "test_crash::test_before": "passed", "test_crash::test_segfault": "failed",
        "test_crash::test_after": "passed", "test_crash::test_local_class_cannot_travel": "failed"}
    segfault = cases["test_crash::test_segfault"][1]
    assert "BASELINE_FAIL on torch_cpu_fp32" in segfault and "SIGSEGV" in segfault
    assert "test_local_class_cannot_travel.<locals>.Local is defined inside a function" in \
        cases["test_crash::test_local_class_cannot_travel"][1]


def test_call_spec_says_what_changed():
    import torch

    from opdiff_snap.pytest_plugin.golden_fixture import CallSpec

    torch.manual_seed(0)
    lin, inp = torch.nn.Linear(3, 2), torch.randn(4, 3)
    spec = CallSpec.of(lin, [inp], {})
    stored = {"hashes": spec.hashes}
    assert CallSpec.of(lin, [inp.clone()], {}).spec_hash == spec.spec_hash       # values, not identity
    assert CallSpec.of(lin, [inp + 1], {}).changed(stored) == "the inputs"
    assert CallSpec.of(lin, [inp], {"scale": 2}).changed(stored) == "the inputs"
    other = torch.nn.Linear(3, 2)
    assert CallSpec.of(other, [inp], {}).changed(stored).startswith("the weights (seed")
    changed = CallSpec.of(torch.nn.Linear(3, 2, bias=False), [inp], {}).changed(stored)
    assert "configuration" in changed and "weights" in changed and "source" not in changed


# ---------------------------------------------------------------- batches

BATCH_PASSING = ["abs", "neg", "acos", "add_broadcast"]
BATCH_OTHERS = {"i0": "EXPORT_FAIL", "mm_bf16": "LOAD_FAIL", "logcumsumexp": "MISMATCH",
                "native_batch_norm_eval": "SHAPE_MISMATCH"}
BATCH_TESTS = [*BATCH_PASSING[:2], *BATCH_OTHERS, *BATCH_PASSING[2:]]
ONLY_THESE = f"""
KEEP = {BATCH_TESTS!r}

def pytest_collection_modifyitems(config, items):
    planned = lambda item: getattr(item, "planned", None)
    drop = [i for i in items if planned(i) is not None and planned(i).test_id not in KEEP]
    config.hook.pytest_deselected(items=drop)
    items[:] = [i for i in items if i not in drop]
"""


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_items_compile_in_batches_and_keep_the_verdicts_they_get_alone(pytester, env):
    """Real ONNX export of shipped goldens, a test that cannot export (`i0`) among passing
    ones: with batches and with --opdiff-batch 1, every item's outcome and verdict is the
    same, the passing ones ran on artifacts their batch compiled, the others alone."""
    from helpers.check import shipped_goldens

    shipped_goldens(pytester.path, BATCH_TESTS)
    (pytester.path / "suites").mkdir()
    shutil.copy(TESTS.parent / "suites" / "core_aten.yaml", pytester.path / "suites")
    pytester.makepyprojecttoml("[tool.opdiff]\nrepeats = 1\nwarmup = 0\n")
    pytester.makeconftest(ONLY_THESE)
    args = ["--opdiff", "-b", "onnx_cpu_fp32", "suites/core_aten.yaml", "-p", "no:cacheprovider", "-rA"]
    seen = {}
    for batch in ("16", "1"):
        shutil.rmtree(pytester.path / ".opdiff-cache", ignore_errors=True)
        result = pytester.runpytest_subprocess(*args, "--opdiff-batch", batch, "--junitxml", f"junit{batch}.xml",
                                               timeout=600)
        result.assert_outcomes(passed=len(BATCH_PASSING), failed=len(BATCH_OTHERS))
        [run] = [r for r in history_runs(pytester.path) if f"junit{batch}.xml" in r.meta["argv"]]
        items = {i["id"]: i for i in run.items}
        assert {t: items[t]["status"] for t in BATCH_OTHERS} == BATCH_OTHERS
        seen[batch] = (junit_cases(pytester.path / f"junit{batch}.xml"), items, section(result, "batches"))
    (cases, items, notes), (cases_alone, items_alone, notes_alone) = seen["16"], seen["1"]
    assert {k: v[0] for k, v in cases.items()} == {k: v[0] for k, v in cases_alone.items()}
    for test_id in BATCH_TESTS:
        b, a = items[test_id], items_alone[test_id]
        assert (b["status"], b.get("error_class")) == (a["status"], a.get("error_class")), test_id
        assert (b.get("message") or "").splitlines()[:1] == (a.get("message") or "").splitlines()[:1], test_id
        assert a.get("batch") is None
    from_batches = [t for t in BATCH_PASSING if items[t].get("batch")]
    assert len(from_batches) >= 2 and all(items[t]["batch"] >= 2 for t in from_batches)
    assert all(items[t].get("batch") is None for t in BATCH_OTHERS)   # their verdicts come from runs alone
    assert len(notes) == 1 and "exporter calls" in notes[0] and notes_alone == []
