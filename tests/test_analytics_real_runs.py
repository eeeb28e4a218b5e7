"""Analytics over a history of REAL runs: a 32-test suite recorded on torch_cpu_fp32, then
checked twice -- ONNX Runtime at opset 18 and at opset 20, beside the perturbing test
backend (clean in run A, breaking aten::exp / aten::tanh in run B). Every canned report
is compared with the same numbers computed here directly from the JSONL files."""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

import pytest
from helpers.check import make_site, new_project, plugin_installed

from opdiff_snap import api
from opdiff_snap.analytics import connect
from opdiff_snap.analytics.reports import diff_runs, latency_report, support_matrix
from opdiff_snap.core.config import Settings
from opdiff_snap.history.runs import read_run

pytestmark = pytest.mark.slow

ONNX, PERTURB = "onnx_cpu_fp32", "perturb_cpu_fp32"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("site"))
    root = new_project(tmp_path_factory.mktemp("real"), "suite30.yaml")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=3, warmup=1)
    with plugin_installed(site), contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        a = api.check(api.CheckRequest(backends=[ONNX, PERTURB], running=api.Running(in_process=True),
                                       preset_options={ONNX: {"opset": 18}}), settings=settings)
        b = api.check(api.CheckRequest(backends=[ONNX, PERTURB], running=api.Running(in_process=True),
                                       preset_options={ONNX: {"opset": 20},
                                      PERTURB: {"perturb": ["aten::exp", "aten::tanh"]}}),
                                       settings=settings)
    return root / "store", read_run(root / a.path), read_run(root / b.path)


def _items(run):
    return {(i["id"], i["seed"], i["preset"]): i for i in run.items}


def test_runs_view_holds_both_real_runs_with_their_presets(history):
    store, a, b = history
    with connect(store, warn=False) as an:
        rows = an.query("SELECT run_id, command, complete, torch, onnxruntime FROM runs "
                        "WHERE command = 'check' ORDER BY started").rows
    assert [r[0] for r in rows] == [a.meta["run_id"], b.meta["run_id"]]
    assert all(r[2] for r in rows)                                  # both have their end line
    assert rows[0][3] == a.meta["env"]["torch"] and rows[0][4] == a.meta["env"]["onnxruntime"]
    assert a.meta["presets"][ONNX]["options"]["opset"] == 18
    assert b.meta["presets"][ONNX]["options"]["opset"] == 20


def test_support_matrix_is_the_latest_verdict_of_each_test_and_preset(history):
    store, _, b = history
    expected = {}
    for (test, _seed, preset), item in _items(b).items():   # run B is the latest for every cell
        expected.setdefault(test, {})[preset] = item["status"]
    matrix = support_matrix(store)
    assert matrix.columns == ["test_id", ONNX, PERTURB]
    got = {row[0]: {ONNX: row[1], PERTURB: row[2]} for row in matrix.rows}
    assert got == expected
    assert {t for t, v in got.items() if v[PERTURB] == "MISMATCH"} == {"exp", "tanh", "tanh_module"}


def test_diff_runs_finds_exactly_what_changed_between_the_two_runs(history):
    store, a, b = history
    ia, ib = _items(a), _items(b)
    newly_failing = sorted(k for k in ia if ia[k]["status"] == "PASS" and ib[k]["status"] != "PASS")
    newly_passing = sorted(k for k in ia if ia[k]["status"] != "PASS" and ib[k]["status"] == "PASS")
    diff = diff_runs(store, a.meta["run_id"], b.meta["run_id"])
    assert [tuple(r[:3]) for r in diff.newly_failing.rows] == newly_failing
    assert [tuple(r[:3]) for r in diff.newly_passing.rows] == newly_passing
    assert {k[0] for k in newly_failing if k[2] == PERTURB} == {"exp", "tanh", "tanh_module"}
    assert diff.only_a == 0 and diff.only_b == 0
    # drift: the perturbed ops moved from max_abs ~0 to the perturbation
    drifted = {(r[0], r[2]) for r in diff.drift.rows}
    assert {("exp", PERTURB), ("tanh", PERTURB), ("tanh_module", PERTURB)} <= drifted


def test_latency_report_matches_ratios_computed_from_the_files(history):
    store, _, b = history
    ib = _items(b)
    ratios = [ib[(t, s, ONNX)]["infer_ms"] / ib[(t, s, PERTURB)]["infer_ms"]
              for (t, s, p) in ib if p == ONNX
              and (ib[(t, s, ONNX)]["infer_ms"] or 0) > 0 and (ib.get((t, s, PERTURB), {}).get("infer_ms") or 0) > 0]
    report = latency_report(store, baseline=PERTURB)
    row = next(r for r in report.ratios.rows if r[0] == ONNX)
    assert row[1] == len(ratios)
    assert row[2] == pytest.approx(statistics.median(ratios), rel=1e-9)
    trend = {(r[0], r[2]): r[4] for r in report.trend.rows}
    assert trend[(b.meta["run_id"], ONNX)] == pytest.approx(
        statistics.median(i["infer_ms"] for i in b.items if i["preset"] == ONNX and (i["infer_ms"] or 0) > 0))
