"""results.Result: the one record of a result, from judge to the JSONL line to DuckDB."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from opdiff_snap.analytics import ingest
from opdiff_snap.analytics.schema import MEANINGS
from opdiff_snap.backends.base import DelegatedOp, Delegation
from opdiff_snap.compare.metrics import NUMBERS, Control, Judged, Metrics
from opdiff_snap.compare.results import Result
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.op_support import UnsupportedOp
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.model import Tolerance

SUITE = Path(__file__).resolve().parent / "helpers" / "check" / "suite30.yaml"

# The item line as docs/architecture.md documents it ("History format"): renaming a field
# of Result changes these keys, and this test says so.
ITEM_KEYS = {"id", "seed", "preset", "status", "error_message", "test_type", "suite", "spec_hash", "tags",
             "baseline", "error_class", "export_ms", "load_ms", "infer_ms", "infer_ms_all", "cache_hit", "batch",
             "tolerance", "metrics", "unsupported_ops", "delegation", "precision_limited", "vacuous", "calibration",
             "expected", "backends", "times_all", "diff_all"}


def full() -> Result:
    """A result with every field set to something other than its default."""
    metrics = Metrics(max_abs=0.5, mean_abs=0.25, mse=0.1, max_rel=0.5, cosine=0.9, mismatched=1,
                      mismatched_frac=0.25, numel=4, worst_index=(0, 3), worst_output="out",
                      worst_expected=1.0, worst_actual=1.5, min_atol=0.4, baseline_error=1e-7,
                      error_bound=4e-7, within_rounding=2, torch_multiple=1.5, torch_factor=3.0, as_torch=1,
                      quant_sqnr=31.5, lowering_sqnr=48.0, lowering_steps=1.0, lowering_bias=0.01,
                      quant_step=0.004, quant_failed="lowering")
    return Result("add__x", 3, "onnx_cpu_fp32", Verdict.MISMATCH, "out: 1 of 4 elements outside",
                  test_type="op", suite="suites/core.yaml", spec_hash="ab12", tags=["binary"],
                  baseline="torch_cpu_fp32", error_class="Mismatch", export_ms=812.3, load_ms=9.1,
                  infer_ms=0.061, infer_ms_all=[0.06, 0.062], cache_hit=True, batch=16,
                  tolerance=Tolerance(1e-5, 1.3e-6, 4.0, 3.0, 2.0, 30.0), metrics=metrics,
                  unsupported_ops=[UnsupportedOp("aten::diff.default", 2, "EXPORT_FAIL", "Unsupported fx node diff",
                                                 ["f32[3, 8], 1, -1"], ["m.py:4 in forward: torch.diff(x)"],
                                                 ["/src/m.py:4"], ["block (Block)"])],
                  delegation=Delegation("XnnpackBackend", 1, [DelegatedOp("aten::linear.default", 2, 0),
                                                             DelegatedOp("aten::cumsum.default", 0, 1,
                                                                         ["m.py:5 in forward: x.cumsum(-1)"])]),
                  precision_limited=True, vacuous="all 4 output elements equal 0", calibration="0123456789abcdef",
                  expected=Verdict.EXPORT_FAIL)


def test_every_field_is_set_by_the_fixture():
    defaults = Result("t", 0, "p", Verdict.PASS)
    assert all(getattr(full(), f.name) != getattr(defaults, f.name) for f in dataclasses.fields(Result))


def test_the_item_line_has_the_documented_keys_and_opdiffs():
    line = full().to_json()
    assert set(line) == ITEM_KEYS
    assert line["id"] == "add__x" and line["status"] == "MISMATCH" and line["baseline"] == "torch_cpu_fp32"
    res = line["backends"][0]["res"]
    assert line["backends"][0]["name"] == "onnx_cpu_fp32" and res["status"] == "MISMATCH"
    assert res["tolerance"] == {"atol": 1e-5, "rtol": 1.3e-6, "baseline_factor": 4.0, "precision_factor": 3.0,
                                "steps": 2.0, "min_sqnr": 30.0}
    assert line["times_all"] == {"onnx_cpu_fp32": {"export_ms": 812.3, "load_ms": 9.1, "infer_ms": 0.061}}
    assert line["diff_all"]["onnx_cpu_fp32"]["worst_index"] == [0, 3]


def test_json_round_trip_keeps_every_field():
    assert Result.from_json(full().to_json()) == full()
    passed = dataclasses.replace(full(), verdict=Verdict.PASS)
    assert passed.to_json()["error_message"] is None          # a PASS carries no error text


def test_what_is_measured_beside_the_metrics_follows_their_numbers():
    m = dataclasses.replace(full().metrics, control=Control("MISMATCH", 0.4, "elementwise"),
                            b_vs_a=Judged("PASS", Metrics(numel=4)), grad=Judged("STRUCTURE_MISMATCH"))
    line = dataclasses.replace(full(), metrics=m).to_json()
    assert list(line["metrics"])[:len(NUMBERS)] == list(NUMBERS)
    assert list(line["metrics"])[len(NUMBERS):] == ["control", "b_vs_a", "grad"]
    assert line["metrics"]["control"] == {"verdict": "MISMATCH", "max_abs": 0.4, "failed_bound": "elementwise"}
    assert line["metrics"]["b_vs_a"] == {"verdict": "PASS", **Metrics(numel=4).to_json()}
    assert line["metrics"]["grad"] == {"verdict": "STRUCTURE_MISMATCH"}
    assert Result.from_json(line).metrics == m
    alone = Metrics(compared=False, b_vs_a=Judged("PASS", Metrics()))   # outputs that could not be compared
    assert alone.to_json() == {"b_vs_a": {"verdict": "PASS", **Metrics().to_json()}}
    assert Metrics.from_json(alone.to_json()) == alone


def test_metrics_of_older_lines_read_back():
    m = Metrics.from_json({"max_abs": "nan", "worst_index": [1], "worst_expected": "inf", "retired": 3})
    assert math.isnan(m.max_abs) and m.worst_index == (1,) and m.worst_expected == "inf" and m.compared
    assert m.bias is None and m.cosine == 1.0   # not written then: the defaults
    assert "retired" not in m.to_json() and m.to_json()["max_abs"] == "nan"


def test_a_case_fills_the_identity_fields():
    case = next(c for c in load_suites([SUITE]) if c.id == "relu_module")
    r = Result.of(case, case.id, 0, "torch_cpu_fp32", Verdict.PASS)
    assert (r.test_type, r.suite, r.spec_hash, r.tags) == ("module", str(case.suite), case.spec_hash,
                                                           list(case.tags))


def test_every_field_is_a_column_of_the_results_view_with_a_meaning():
    columns = set(ingest._COLUMNS)
    line = full().to_json()
    expected = ({k for k in line if k not in ("backends", "times_all", "diff_all", "id", "tolerance", "metrics")}
                | {"test_id"} | {f.name for f in dataclasses.fields(Tolerance)}
                | set(NUMBERS))
    assert expected <= columns, expected - columns
    assert columns == set(MEANINGS["results"]), columns ^ set(MEANINGS["results"])
