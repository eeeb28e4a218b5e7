"""`opdiff check` verdicts through the Python API (in-process jobs, real backends):
tolerance edges and precedence, NaN/Inf placement, shape and dtype, pairs, gradients,
STALE, NO_GOLDEN, CORRUPT, SKIPPED, UNAVAILABLE, goldens-only mode."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from helpers.check import copy_project, flip_byte, make_site, new_project, plugin_installed

from opdiff_snap import api
from opdiff_snap.compare.rules import BASELINE_FACTOR
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.goldens import GoldenStore, store_key
from opdiff_snap.goldens.cases import UntrustedGolden
from opdiff_snap.history.runs import read_run
from opdiff_snap.suite.model import Tolerance

OFFSET = 2.0 ** -10   # exact in float32: 1.0 + OFFSET is exactly representable


def settings(suites=True) -> Settings:
    """Paths relative to the project (the helpers chdir into it), as a user's would be."""
    return Settings(suites=Path("suites" if suites else "no-suites"), jobs=1, repeats=1, warmup=0)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("site"))
    with plugin_installed(site):
        yield site


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """edge.yaml + suite_tol.yaml recorded once on torch_cpu_fp32 (in-process)."""
    root = new_project(tmp_path_factory.mktemp("edge"), "edge.yaml", "suite_tol.yaml")
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings())
    assert {r.verdict for r in report.results} == {Verdict.RECORDED}
    return root


@pytest.fixture
def project(recorded, tmp_path):
    return copy_project(recorded, tmp_path / "p")


def check(root, backends, *, suites=True, test_ids=None, tags=None, seed_list=None, **request):
    selection = api.Selection(test_ids=test_ids, tags=tags, seed_list=seed_list)
    with contextlib.chdir(root):
        report = api.check(api.CheckRequest(backends, selection, api.Running(in_process=True), **request),
                           settings=settings(suites))
    report.path = root / report.path
    return report, {(r.test_id, r.preset): r for r in report.results}


def perturb(**options):
    return {"perturb_cpu_fp32": options}


# ---------------------------------------------------------------- tolerance

def test_tolerance_edges_atol_and_rtol_exactly_at_the_boundary(site, recorded):
    opts = perturb(offset=OFFSET)
    ids = ["tol_default"]
    below = math.nextafter(OFFSET, 0.0)
    _, at = check(recorded, ["perturb_cpu_fp32"], preset_options=opts, test_ids=ids,
                  tolerance=Tolerance(atol=OFFSET, rtol=0.0))
    _, out = check(recorded, ["perturb_cpu_fp32"], preset_options=opts, test_ids=ids,
                   tolerance=Tolerance(atol=below, rtol=0.0))
    assert at["tol_default", "perturb_cpu_fp32"].verdict is Verdict.PASS
    r = out["tol_default", "perturb_cpu_fp32"]
    assert r.verdict is Verdict.MISMATCH
    assert r.metrics.max_abs == OFFSET and r.metrics.mismatched == 8
    assert r.metrics.min_atol == OFFSET and r.tolerance == Tolerance(below, 0.0, BASELINE_FACTOR)
    # rtol alone (|expected| is 1.0 everywhere)
    _, at = check(recorded, ["perturb_cpu_fp32"], preset_options=opts, test_ids=ids,
                  tolerance=Tolerance(atol=0.0, rtol=OFFSET))
    _, out = check(recorded, ["perturb_cpu_fp32"], preset_options=opts, test_ids=ids,
                   tolerance=Tolerance(atol=0.0, rtol=below))
    assert at["tol_default", "perturb_cpu_fp32"].verdict is Verdict.PASS
    assert out["tol_default", "perturb_cpu_fp32"].verdict is Verdict.MISMATCH


def test_tolerance_per_test_per_suite_per_preset_glob_and_cli_precedence(site, recorded):
    opts = perturb(offset=OFFSET)
    report, res = check(recorded, ["perturb_cpu_fp32"], preset_options=opts, tags=["tol"])
    verdicts = {k[0]: r.verdict for k, r in res.items()}
    assert verdicts == {"tol_default": Verdict.MISMATCH,   # fp32 default atol 1e-5
                        "tol_test": Verdict.PASS,          # test's {atol: 1e-3}
                        "tol_glob": Verdict.PASS,          # "perturb_*" beats "fp32"
                        "tol_suite": Verdict.PASS}         # the suite's defaults
    assert res["tol_default", "perturb_cpu_fp32"].tolerance == Tolerance(1e-5, 1.3e-6, BASELINE_FACTOR)
    assert res["tol_glob", "perturb_cpu_fp32"].tolerance == Tolerance(1e-3, 0.0, BASELINE_FACTOR)
    # the command line overrides every YAML tolerance
    _, res = check(recorded, ["perturb_cpu_fp32"], preset_options=opts, tags=["tol"],
                   tolerance=Tolerance(atol=1e-6))
    assert {k[0]: r.verdict for k, r in res.items()} == dict.fromkeys(verdicts, Verdict.MISMATCH)
    # the glob does not apply to torch_cpu_fp32, whose fp32 entry is used (and passes: no offset)
    _, res = check(recorded, ["torch_cpu_fp32"], test_ids=["tol_glob"])
    assert res["tol_glob", "torch_cpu_fp32"].tolerance == Tolerance(1e-6, 0.0, BASELINE_FACTOR)
    # the history keeps the tolerance used
    items = read_run(report.path).items
    assert {i["id"]: i["tolerance"] for i in items}["tol_test"] == {"atol": 1e-3, "rtol": 0.0,
                                                                   "baseline_factor": BASELINE_FACTOR,
                                                                   "precision_factor": None, "steps": None,
                                                                   "min_sqnr": None}


# ---------------------------------------------------------------- NaN / Inf, shape, dtype, int

def test_nan_and_inf_at_the_same_places_pass_and_a_moved_nan_fails(site, recorded):
    store = GoldenStore(recorded / "goldens")
    out = store.read("nan_inf", 0).outputs
    assert int(out.isnan().sum()) == 2 and int(out.isinf().sum()) == 1
    _, res = check(recorded, ["torch_cpu_fp32", "perturb_cpu_fp32"], test_ids=["nan_inf"])
    assert res["nan_inf", "torch_cpu_fp32"].verdict is Verdict.PASS
    assert res["nan_inf", "perturb_cpu_fp32"].verdict is Verdict.PASS   # no options: eager
    _, res = check(recorded, ["perturb_cpu_fp32"], preset_options=perturb(move_nan=True),
                   test_ids=["nan_inf"])
    r = res["nan_inf", "perturb_cpu_fp32"]
    assert r.verdict is Verdict.MISMATCH
    assert "NaN/Inf" in r.message and r.metrics.mismatched == 2


def test_shape_and_dtype_mismatches_are_their_own_verdicts(site, recorded):
    _, res = check(recorded, ["perturb_cpu_fp32"], preset_options=perturb(append=True),
                   test_ids=["tol_default;int_add"])
    assert res["tol_default", "perturb_cpu_fp32"].verdict is Verdict.SHAPE_MISMATCH
    assert "(2, 4)" in res["tol_default", "perturb_cpu_fp32"].message
    assert res["int_add", "perturb_cpu_fp32"].verdict is Verdict.SHAPE_MISMATCH
    _, res = check(recorded, ["perturb_cpu_fp32"], preset_options=perturb(cast="float64"),
                   test_ids=["tol_default;int_add"])
    r = res["tol_default", "perturb_cpu_fp32"]
    assert r.verdict is Verdict.DTYPE_MISMATCH and "torch.float64" in r.message
    assert res["int_add", "perturb_cpu_fp32"].verdict is Verdict.PASS   # cast touches floats only


# ---------------------------------------------------------------- pairs and gradients

def test_pair_sides_are_each_judged_against_their_golden(site, recorded):
    _, res = check(recorded, ["torch_cpu_fp32", "perturb_cpu_fp32"], tags=["pair"],
                   preset_options=perturb(offset=0.5))
    # gelu tanh vs exact differ by ~1e-4..5e-4, more than fp32's tolerance: on the baseline
    # itself each side still matches its own golden, so the pair passes; b vs a is a metric
    r = res["pair_gelu", "torch_cpu_fp32"]
    assert r.verdict is Verdict.PASS
    assert r.metrics.b_vs_a.verdict == "MISMATCH" and r.metrics.b_vs_a.metrics.max_abs > 1e-5
    assert res["pair_relu", "torch_cpu_fp32"].metrics.b_vs_a.verdict == "PASS"
    # an offset on both sides cancels in b vs a; against the goldens it does not
    r = res["pair_relu", "perturb_cpu_fp32"]
    assert r.verdict is Verdict.MISMATCH and r.metrics.max_abs == 0.5
    assert r.message.startswith("side a (relu) and side b (threshold) drift from their golden")
    assert r.metrics.b_vs_a.verdict == "PASS"


def _store_grads(root, scale: float = 1.0) -> None:
    """Add recorded gradients to lin_grad's golden (as `opdiff record` does for grad: true)."""
    from opdiff_snap.execution.gradients import record_grads
    from opdiff_snap.suite import load_suites
    from opdiff_snap.suite.model import RecordedGrads

    store = GoldenStore(root / "goldens")
    golden = store.read("lin_grad", 0)
    with contextlib.chdir(root):
        case = next(c for c in load_suites([Path("suites/edge.yaml")]) if c.id == "lin_grad")
    cot, grads = record_grads(case, golden.invocation, 0)
    grads["params"]["bias"] = grads["params"]["bias"] * scale
    golden.grads = RecordedGrads(cot, grads)
    store.write(golden)


def test_gradient_parity_passes_and_a_wrong_gradient_is_a_mismatch(site, project):
    _store_grads(project)
    report, res = check(project, ["torch_cpu_fp32", "perturb_cpu_fp32"], test_ids=["lin_grad"])
    r = res["lin_grad", "torch_cpu_fp32"]
    assert r.verdict is Verdict.PASS and r.metrics.grad.verdict == "PASS"
    assert res["lin_grad", "perturb_cpu_fp32"].metrics.grad is None  # cannot differentiate
    item = next(i for i in read_run(report.path).items if i["preset"] == "torch_cpu_fp32")
    assert item["metrics"]["max_abs"] == 0.0 and item["metrics"]["grad"]["numel"] > 0

    _store_grads(project, scale=1.01)   # a recorded gradient the target will not reproduce
    _, res = check(project, ["torch_cpu_fp32"], test_ids=["lin_grad"])
    r = res["lin_grad", "torch_cpu_fp32"]
    assert r.verdict is Verdict.MISMATCH
    assert "gradient" in r.message and "grad[bias]" in r.message
    assert r.metrics.max_abs == 0.0 and r.metrics.grad.metrics.max_abs > 0


# ---------------------------------------------------------------- decided without comparing

def test_stale_after_editing_the_yaml_and_the_file_module_and_no_golden(site, project):
    suite = project / "suites" / "edge.yaml"
    text = suite.read_text()
    text = text.replace("{id: int_add, op: aten::add.Tensor", "{id: int_add, op: aten::sub.Tensor")
    text += "  - {id: brand_new, op: aten::neg.default, in: [{ref: x}]}\n"
    suite.write_text(text)
    mods = project / "suites" / "mods.py"
    mods.write_text(mods.read_text().replace("x * self.k", "x * self.k + 0"))
    report, res = check(project, ["torch_cpu_fp32"])
    assert res["int_add", "torch_cpu_fp32"].verdict is Verdict.STALE
    assert res["scale_file", "torch_cpu_fp32"].verdict is Verdict.STALE
    assert "re-record" in res["scale_file", "torch_cpu_fp32"].message
    assert res["brand_new", "torch_cpu_fp32"].verdict is Verdict.NO_GOLDEN
    assert res["tol_default", "torch_cpu_fp32"].verdict is Verdict.PASS
    # a test removed from the suites leaves an orphaned golden: STALE, not silently dropped
    suite.write_text(text.replace("  - {id: skip_onnx,", "  - {id: skip_onnx_renamed,"))
    _, res = check(project, ["torch_cpu_fp32"])
    assert res["skip_onnx", "torch_cpu_fp32"].verdict is Verdict.STALE
    assert "no longer exists" in res["skip_onnx", "torch_cpu_fp32"].message
    assert res["skip_onnx_renamed", "torch_cpu_fp32"].verdict is Verdict.NO_GOLDEN


def test_corrupt_chunk_and_corrupt_metadata(site, project):
    goldens = project / "goldens"
    flip_byte(goldens / store_key("tol_test", 0) / "0")
    (goldens / store_key("int_add", 0) / "zarr.json").write_text('{"zarr_format": 3, "node_t')
    for suites in (True, False):   # without suites, scale_file's file: module needs --trust-goldens
        _, res = check(project, ["torch_cpu_fp32"], suites=suites, trust_goldens=not suites)
        assert res["tol_test", "torch_cpu_fp32"].verdict is Verdict.CORRUPT
        assert "re-record" in res["tol_test", "torch_cpu_fp32"].message.lower()
        corrupt = [k for k, r in res.items() if r.verdict is Verdict.CORRUPT]
        assert len(corrupt) == 2, corrupt   # the broken metadata too, never NO_GOLDEN
        if suites:
            assert res["int_add", "torch_cpu_fp32"].verdict is Verdict.CORRUPT
        else:   # its id is in the broken metadata: named by its store key
            assert any(k[0] == f"<unknown: {store_key('int_add', 0)}>" for k in corrupt)
        assert res["tol_default", "torch_cpu_fp32"].verdict is Verdict.PASS


def test_goldens_only_mode_uses_stored_definitions_tags_and_seeds(site, project):
    # no suite given vouches for the file: module of scale_file (its recorded suite path,
    # read from the golden, never does): refused unless the store is trusted
    with pytest.raises(UntrustedGolden) as refused:
        check(project, ["torch_cpu_fp32"], suites=False)
    assert [(tid, paths) for tid, _, paths in refused.value.found] == [("scale_file", ["file:mods.py::Scale"])]
    report, res = check(project, ["torch_cpu_fp32"], suites=False, trust_goldens=True)
    assert len(res) == 11 and report.counts() == {"PASS": 11}
    _, res = check(project, ["torch_cpu_fp32"], suites=False, tags=["tol"])
    assert sorted(k[0] for k in res) == ["tol_default", "tol_glob", "tol_suite", "tol_test"]
    _, res = check(project, ["torch_cpu_fp32"], suites=False, test_ids=["pair_*"])
    assert sorted(k[0] for k in res) == ["pair_gelu", "pair_relu"]
    _, res = check(project, ["torch_cpu_fp32"], suites=False, seed_list=[3])
    assert res == {}
    # a file: module edited after record still makes the golden STALE without suites
    mods = project / "suites" / "mods.py"
    mods.write_text(mods.read_text() + "\n# edited\n")
    _, res = check(project, ["torch_cpu_fp32"], suites=False, test_ids=["scale_file"], trust_goldens=True)
    assert res["scale_file", "torch_cpu_fp32"].verdict is Verdict.STALE


@pytest.mark.slow
def test_skipped_by_the_suite_and_onnx_runs_the_rest(site, recorded, tmp_path):
    root = copy_project(recorded, tmp_path / "p")
    report, res = check(root, ["onnx_cpu_fp32"], test_ids=["skip_onnx;int_add"])
    r = res["skip_onnx", "onnx_cpu_fp32"]
    assert r.verdict is Verdict.SKIPPED and r.message == "known ONNX gap (test)"
    assert res["int_add", "onnx_cpu_fp32"].verdict is Verdict.PASS
    item = next(i for i in read_run(report.path).items if i["id"] == "skip_onnx")
    assert item["status"] == "SKIPPED" and item["error_message"] == "known ONNX gap (test)"


@pytest.mark.slow
def test_coreml_on_linux_converts_then_is_unavailable(site, recorded, tmp_path):
    import sys
    if sys.platform == "darwin":
        pytest.skip("CoreML predicts on macOS")
    root = copy_project(recorded, tmp_path / "p")
    report, res = check(root, ["coreml_any_fp32"], test_ids=["tol_default"])
    r = res["tol_default", "coreml_any_fp32"]
    assert r.verdict is Verdict.UNAVAILABLE
    assert r.export_ms is not None and r.export_ms > 0
    assert "macOS" in r.message and "exported" in r.message
    assert r.infer_ms is None
    item = read_run(report.path).items[0]
    assert item["status"] == "UNAVAILABLE" and item["export_ms"] > 0


def test_bad_input_is_an_opdiff_error(site, recorded, tmp_path):
    with pytest.raises(OpdiffError, match="did you mean|Did you mean"):
        check(recorded, ["torch_cpu_fp23"])
    with pytest.raises(OpdiffError, match="not a --backend"):
        check(recorded, ["torch_cpu_fp32"], preset_options=perturb(offset=1.0))
    with pytest.raises(OpdiffError, match="no golden store"):
        check(tmp_path, ["torch_cpu_fp32"])


def _interrupted(report, keep: int = 2) -> None:
    """Cut a finished run's file back to its meta line and `keep` items, the next one half-written."""
    lines = report.path.read_bytes().splitlines(keepends=True)
    assert b'"type": "end"' in lines[-1]
    report.path.write_bytes(b"".join(lines[:1 + keep]) + lines[1 + keep][:20])


def test_resume_runs_only_the_missing_items_and_needs_the_same_plan(site, project):
    report, _ = check(project, ["torch_cpu_fp32"], tags=["tol"])
    assert len(report.path.read_bytes().splitlines()) == 6
    _interrupted(report)
    refused = {  # each a one-paragraph diff naming what changed; nothing is written
        "presets": dict(backends=["perturb_cpu_fp32"], tags=["tol"]),
        "synchronize": dict(backends=["torch_cpu_fp32"], tags=["tol"],
                            preset_options={"torch_cpu_fp32": {"synchronize": False}}),
        "tags": dict(backends=["torch_cpu_fp32"], tags=["pair"]),
        "test_ids": dict(backends=["torch_cpu_fp32"], tags=["tol"], test_ids=["tol_*"]),
        "seed_list": dict(backends=["torch_cpu_fp32"], tags=["tol"], seed_list=[0, 1]),
        "tolerance": dict(backends=["torch_cpu_fp32"], tags=["tol"], tolerance=Tolerance(atol=1e-3)),
    }
    before = report.path.read_bytes()
    for fragment, kw in refused.items():
        backends = kw.pop("backends")
        with pytest.raises(OpdiffError, match=f"planned something else.*{fragment}") as err:
            check(project, backends, resume=report.run_id, **kw)
        assert "Resume with the original command" in str(err.value)
        assert report.path.read_bytes() == before
    again, res = check(project, ["torch_cpu_fp32"], tags=["tol"], resume=report.run_id)
    assert len(res) == 4   # the report covers the whole run
    run = read_run(report.path)
    keys = [(i["id"], i["seed"], i["preset"]) for i in run.items]
    assert len(keys) == len(set(keys)) == 4 and run.end["resumed"] == 2
    assert run.end["counts"] == {"PASS": 4}


def test_tolerance_overrides_must_be_finite_and_non_negative(site, recorded):
    for bad in (float("nan"), -1e-3, float("inf")):
        with pytest.raises(OpdiffError, match="finite number >= 0"):
            check(recorded, ["torch_cpu_fp32"], tolerance=Tolerance(atol=bad, rtol=None))


def test_a_selection_that_matches_nothing_is_an_error_not_a_green_run(site, recorded):
    with pytest.raises(OpdiffError, match="no test matches"):
        check(recorded, ["torch_cpu_fp32"], test_ids=["tol_tpyo*"])


def test_resume_refuses_a_run_whose_suite_changed_since(site, project):
    report, _ = check(project, ["torch_cpu_fp32"], tags=["tol"])
    _interrupted(report)
    suite = project / "suites" / "suite_tol.yaml"
    suite.write_text(suite.read_text().replace("shape: [3]", "shape: [4]"))
    with pytest.raises(OpdiffError, match=r"1 test\(s\) changed since \(spec hash: tol_suite seed 0\)"):
        check(project, ["torch_cpu_fp32"], tags=["tol"], resume=report.run_id)
    assert not read_run(report.path).complete


def test_an_end_line_only_under_every_planned_item_exactly_once(site, project):
    from opdiff_snap.history import runs as history

    report, _ = check(project, ["torch_cpu_fp32"], tags=["tol"])
    lines = report.path.read_bytes().splitlines(keepends=True)
    foreign = b'{"type": "item", "id": "not_planned", "seed": 0, "preset": "torch_cpu_fp32", "status": "PASS"}\n'
    report.path.write_bytes(b"".join(lines[:4]) + foreign)   # 3 items kept, and one nobody planned
    with pytest.raises(OpdiffError, match="without its end line: it holds 1 results that were not planned"):
        check(project, ["torch_cpu_fp32"], tags=["tol"], resume=report.run_id)
    run = read_run(report.path)
    assert not run.complete
    summary = next(r for r in history.list_runs(project / "store") if r.run_id == report.run_id)
    assert summary.resumable and not summary.complete


def test_resume_refuses_a_record_run_and_runs_does_not_offer_it(site, project):
    from opdiff_snap.history import runs as history

    with contextlib.chdir(project):
        rec = api.record(api.RecordRequest(selection=api.Selection(test_ids=["tol_default"]),
                                           running=api.Running(in_process=True), force=True), settings=settings())
    run_path = project / rec.path
    run_path.write_text("".join(run_path.read_text().splitlines(keepends=True)[:-1]))  # drop the end line
    with pytest.raises(OpdiffError, match="re-run `opdiff record`"):
        check(project, ["torch_cpu_fp32"], resume=rec.run_id)
    summary = next(r for r in history.list_runs(project / "store") if r.run_id == rec.run_id)
    assert not summary.resumable and "re-run `opdiff record`" in summary.note


def test_a_seed_given_twice_is_checked_once(site, recorded):
    from opdiff_snap.cli.option_groups import parse_seed_list

    assert parse_seed_list("0,0,3,0") == [0, 3]
    report, _ = check(recorded, ["torch_cpu_fp32"], test_ids=["tol_default"], seed_list=parse_seed_list("0,0"))
    assert [(r.test_id, r.seed) for r in report.results] == [("tol_default", 0)]
