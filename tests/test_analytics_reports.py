"""Canned reports against expectations worked out by hand from a small history.

The history (three check runs, the first on onnxruntime 1.30.0, the others on 1.31.1):

    r1 2026-01-01 ort 1.30.0 complete
       torch  add 1.0  mul 2.0  relu 1.0  conv 4.0               all PASS
       onnx   add 0.5  mul 1.0  relu 2.0 (max_abs 1e-6)  conv 2.0 [1.9 2.0 2.1]   all PASS
       et     add 1.0 PASS, mul EXPORT_FAIL
    r2 2026-01-02 ort 1.31.1 complete
       torch  same as r1
       onnx   add 0.5 PASS, mul 1.0 MISMATCH (max_abs 0.5), relu 3.0 [0.8 1 3 3.2 5]
              PASS (max_abs 1e-3), conv 4.0 [3.9 4.0 4.1] PASS
       et     add 1.0 PASS, mul 3.0 PASS
    r3 2026-01-03 ort 1.31.1 interrupted (no end line, truncated last line)
       torch add 1.0 PASS, onnx add INFER_FAIL
"""

from __future__ import annotations

import math

import pytest
from helpers.history.synth import Res, Run, write_run

from opdiff_snap.analytics import connect, format_table
from opdiff_snap.analytics.reports import diff_runs, latency_report, latency_trend, support_matrix, version_key
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import PRECEDENCE, Verdict

T, O, E = "torch_cpu_fp32", "onnx_cpu_fp32", "executorch_cpu_fp32"


def _torch():
    return [Res("add", T, infer_ms=1.0), Res("mul", T, infer_ms=2.0), Res("relu", T, infer_ms=1.0),
            Res("conv", T, infer_ms=4.0)]


def build_history(store):
    r1 = _torch() + [
        Res("add", O, infer_ms=0.5), Res("mul", O, infer_ms=1.0),
        Res("relu", O, infer_ms=2.0, max_abs=1e-6),
        Res("conv", O, infer_ms=2.0, infer_ms_all=[1.9, 2.0, 2.1]),
        Res("add", E, infer_ms=1.0),
        Res("mul", E, status="EXPORT_FAIL", infer_ms=None, max_abs=None, error_class="RuntimeError",
            error_message="no kernel")]
    r2 = _torch() + [
        Res("add", O, infer_ms=0.5), Res("mul", O, status="MISMATCH", infer_ms=1.0, max_abs=0.5),
        Res("relu", O, infer_ms=3.0, infer_ms_all=[0.8, 1.0, 3.0, 3.2, 5.0], max_abs=1e-3),
        Res("conv", O, infer_ms=4.0, infer_ms_all=[3.9, 4.0, 4.1]),
        Res("add", E, infer_ms=1.0), Res("mul", E, infer_ms=3.0)]
    r3 = [Res("add", T, infer_ms=1.0),
          Res("add", O, status="INFER_FAIL", infer_ms=None, max_abs=None)]
    write_run(store, Run("r1", "2026-01-01T00:00:00Z", r1, env={"onnxruntime": "1.30.0"}))
    write_run(store, Run("r2", "2026-01-02T00:00:00Z", r2))
    p = write_run(store, Run("r3", "2026-01-03T00:00:00Z", r3, complete=False))
    with open(p, "a") as f:
        f.write('{"type": "item", "run_id": "r3", "id": "mul", "se')   # killed mid-write
    return p


@pytest.fixture
def hist(tmp_path):
    truncated = build_history(tmp_path)
    with pytest.warns(UserWarning, match="r3.jsonl:4: truncated or corrupt"):
        a = connect(tmp_path)
    with a:
        yield a, truncated


def test_truncated_line_warns_and_history_still_answers(hist):
    a, path = hist
    assert a.warnings == [f"{path.resolve()}:4: truncated or corrupt JSON line skipped"]
    t = a.query("SELECT run_id, complete, onnxruntime FROM runs ORDER BY started")
    assert t.rows == [("r1", True, "1.30.0"), ("r2", True, "1.31.1"), ("r3", False, "1.31.1")]
    assert a.query("SELECT count(*) FROM results WHERE run_id = 'r3'").rows == [(2,)]


def test_results_columns(hist):
    a, _ = hist
    t = a.query("SELECT test_id, seed, preset, baseline, status, infer_ms, infer_ms_all, atol, "
                "max_abs, worst_index, error_class, line FROM results "
                "WHERE run_id = 'r1' AND test_id = 'mul' ORDER BY preset")
    assert t.rows == [
        ("mul", 0, E, T, "EXPORT_FAIL", None, [], 1e-5, None, None, "RuntimeError", 11),
        ("mul", 0, O, T, "PASS", 1.0, [1.0], 1e-5, 0.0, [0, 1], None, 7),
        ("mul", 0, T, T, "PASS", 2.0, [2.0], 1e-5, 0.0, [0, 1], None, 3)]


def test_support_matrix_latest_verdict(hist):
    a, _ = hist
    t = support_matrix(a)
    assert t.columns == ["test_id", E, O, T]
    assert t.rows == [("add", "PASS", "INFER_FAIL", "PASS"),
                      ("conv", None, "PASS", "PASS"),
                      ("mul", "PASS", "MISMATCH", "PASS"),
                      ("relu", None, "PASS", "PASS")]


def test_support_matrix_across_onnxruntime_versions(hist):
    a, _ = hist
    t = support_matrix(a, by="onnxruntime")
    assert t.columns == ["test_id", f"{E}@1.30.0", f"{E}@1.31.1", f"{O}@1.30.0", f"{O}@1.31.1",
                         f"{T}@1.30.0", f"{T}@1.31.1"]
    assert t.rows == [("add", "PASS", "PASS", "PASS", "INFER_FAIL", "PASS", "PASS"),
                      ("conv", None, None, "PASS", "PASS", "PASS", "PASS"),
                      ("mul", "EXPORT_FAIL", "PASS", "PASS", "MISMATCH", "PASS", "PASS"),
                      ("relu", None, None, "PASS", "PASS", "PASS", "PASS")]
    with pytest.raises(OpdiffError, match="onnxruntime"):
        support_matrix(a, by="onnxruntim")


def test_latency_report(hist):
    a, _ = hist
    rep = latency_report(a)
    assert rep.baseline == T
    # onnx, latest timings (r2) over torch in r2: add .5, conv 1, mul .5, relu 3
    # executorch: add 1/1, mul 3/2
    assert rep.samples == {E: [1.0, 1.5], O: [0.5, 1.0, 0.5, 3.0]}
    (p1, n1, med1, geo1, f1, s1), (p2, n2, med2, geo2, f2, s2) = rep.ratios.rows
    assert (p1, n1, med1, f1, s1) == (E, 2, 1.25, 0, 1)
    assert geo1 == pytest.approx(math.sqrt(1.5))
    assert (p2, n2, med2, f2, s2) == (O, 4, 0.75, 2, 1)
    assert geo2 == pytest.approx(0.75 ** 0.25)


def test_latency_trend(hist):
    a, _ = hist
    t = latency_trend(a)
    assert [(r, p, n, m) for r, _, p, n, m in t.rows] == [
        ("r1", E, 1, 1.0), ("r1", O, 4, 1.5), ("r1", T, 4, 1.5),
        ("r2", E, 2, 2.0), ("r2", O, 4, 2.0), ("r2", T, 4, 1.5),
        ("r3", T, 1, 1.0)]


def _check_r1_r2(d):
    assert d.newly_failing.rows == [("mul", 0, O, "PASS", "MISMATCH", None, None)]
    assert d.newly_passing.rows == [("mul", 0, E, "EXPORT_FAIL", "PASS")]
    # mul: 0.5 / max(0, 1e-5) = 50000; relu: 1e-3 / max(1e-6, 1e-5) = 100
    assert [(t, p) for t, _, p, *_ in d.drift.rows] == [("mul", O), ("relu", O)]
    assert [r[-1] for r in d.drift.rows] == pytest.approx([50000.0, 100.0])
    # conv 2.0 -> 4.0 counts (threshold max(.25*2, 3*0.1)); relu 2.0 -> 3.0 is inside the
    # spread of its repeats (IQR 2.2, threshold 6.6) so it does not
    assert len(d.latency.rows) == 1
    test, seed, preset, ma, mb, ratio, thr = d.latency.rows[0]
    assert (test, seed, preset, ma, mb, ratio) == ("conv", 0, O, 2.0, 4.0, 2.0)
    assert thr == pytest.approx(0.5)
    assert (d.only_a, d.only_b) == (0, 0)


def test_diff_runs(hist):
    a, _ = hist
    d = diff_runs(a, "r1", "r2")
    _check_r1_r2(d)
    assert "1 newly failing, 1 newly passing, 2 drifted, 1 latency changes" in d.summary()
    # a looser spread rule: relu counts too when the repeat spread is not considered
    d2 = diff_runs(a, "r1", "r2", spread_k=0.0)
    assert [(r[0], r[5]) for r in d2.latency.rows] == [("conv", 2.0), ("relu", 1.5)]
    # r2 -> r3: the interrupted run has only add; everything else is only in A
    d3 = diff_runs(a, "r2", "r3")
    assert d3.newly_failing.rows == [("add", 0, O, "PASS", "INFER_FAIL", None, None)]
    assert (d3.only_a, d3.only_b) == (8, 0)


def test_diff_runs_by_version(hist):
    a, _ = hist
    d = diff_runs(a, by="onnxruntime")      # r3 is incomplete: r2 is the latest on 1.31.1
    assert (d.a, d.b) == ("r1", "r2")
    assert d.label_b == "onnxruntime 1.31.1 (r2)"
    _check_r1_r2(d)
    d = diff_runs(a, by="onnxruntime", versions=("1.31.1", "1.30.0"))
    assert (d.a, d.b) == ("r2", "r1")
    with pytest.raises(OpdiffError, match="no complete check run with onnxruntime 1.29"):
        diff_runs(a, by="onnxruntime", versions=("1.29.0", "1.30.0"))
    with pytest.raises(OpdiffError, match="two versions of torch"):
        diff_runs(a, by="torch")


def test_diff_runs_bad_ids(hist):
    a, _ = hist
    with pytest.raises(OpdiffError, match="ambiguous"):
        diff_runs(a, "r", "r2")
    with pytest.raises(OpdiffError, match="no run 'x9'"):
        diff_runs(a, "x9", "r2")


def _seeds(test_id, preset, *statuses):
    return [Res(test_id, preset, status=st, seed=i) for i, st in enumerate(statuses)]


def test_support_matrix_cell_is_the_worst_verdict_by_precedence(tmp_path):
    """Several seeds in one cell: the worst verdict by precedence, not the first by spelling
    (alphabetically CORRUPT < CRASH, DTYPE_MISMATCH < LOAD_FAIL, MISMATCH < TIMEOUT)."""
    results = (_seeds("crash", O, "PASS", "CRASH", "PASS") + _seeds("export", O, "MISMATCH", "EXPORT_FAIL")
               + _seeds("timeout", O, "MISMATCH", "TIMEOUT") + _seeds("load", O, "DTYPE_MISMATCH", "LOAD_FAIL")
               + _seeds("corrupt", O, "CORRUPT", "CRASH") + _seeds("quiet", O, "SKIPPED", "UNAVAILABLE")
               + _seeds("pass", O, "PASS", "PASS"))
    write_run(tmp_path, Run("r1", "2026-01-01T00:00:00Z", results))
    with connect(tmp_path) as a:
        t = support_matrix(a)
    assert dict(t.rows) == {"crash": "CRASH", "export": "EXPORT_FAIL", "timeout": "TIMEOUT",
                            "load": "LOAD_FAIL", "corrupt": "CRASH", "quiet": "UNAVAILABLE", "pass": "PASS"}


def test_support_matrix_follows_precedence_for_every_pair(tmp_path):
    results = [r for i, va in enumerate(Verdict) for vb in list(Verdict)[i + 1:]
               for r in _seeds(f"{va.value}+{vb.value}", O, va.value, vb.value)]
    write_run(tmp_path, Run("r1", "2026-01-01T00:00:00Z", results))
    with connect(tmp_path) as a:
        t = support_matrix(a)
    assert len(t.rows) == len(Verdict) * (len(Verdict) - 1) // 2
    for test_id, verdict in t.rows:
        pair = [Verdict(v) for v in test_id.split("+")]
        assert verdict == min(pair, key=PRECEDENCE.index).value, test_id


def test_diff_runs_not_run_is_neither_newly_failing_nor_newly_passing(tmp_path):
    before = {"skipped": "PASS", "unavailable": "PASS", "no_golden": "PASS", "stale": "PASS",
              "mismatch": "PASS", "corrupt": "PASS", "back": "SKIPPED", "fixed": "CRASH",
              "unskipped": "UNAVAILABLE", "skipped_crash": "CRASH", "recorded": "RECORDED"}
    after = {"skipped": "SKIPPED", "unavailable": "UNAVAILABLE", "no_golden": "NO_GOLDEN", "stale": "STALE",
             "mismatch": "MISMATCH", "corrupt": "CORRUPT", "back": "PASS", "fixed": "PASS",
             "unskipped": "PASS", "skipped_crash": "SKIPPED", "recorded": "BASELINE_FAIL"}
    write_run(tmp_path, Run("ra", "2026-01-01T00:00:00Z", [Res(t, O, status=st) for t, st in before.items()]))
    write_run(tmp_path, Run("rb", "2026-01-02T00:00:00Z", [Res(t, O, status=st) for t, st in after.items()]))
    with connect(tmp_path) as a:
        d = diff_runs(a, "ra", "rb")
    assert [(r[0], r[3], r[4]) for r in d.newly_failing.rows] == [
        ("corrupt", "PASS", "CORRUPT"), ("mismatch", "PASS", "MISMATCH"), ("recorded", "RECORDED", "BASELINE_FAIL")]
    assert [(r[0], r[3], r[4]) for r in d.newly_passing.rows] == [("fixed", "CRASH", "PASS")]


def test_formats(hist):
    a, _ = hist
    t = support_matrix(a)
    md = format_table(t, "markdown")
    assert md.splitlines()[2] == "| add | PASS | INFER_FAIL | PASS |"
    assert format_table(t, "csv").splitlines()[2] == "conv,,PASS,PASS"
    assert '"onnx_cpu_fp32": "MISMATCH"' in format_table(t, "json")
    assert format_table(t, "table").splitlines()[0].split() == t.columns
    with pytest.raises(OpdiffError, match="did you mean 'json'"):
        format_table(t, "jsn")


def test_version_key():
    assert sorted(["1.10.0", "1.9.2", "1.31.1", "2.13.0+cpu"], key=version_key) == \
        ["1.9.2", "1.10.0", "1.31.1", "2.13.0+cpu"]
