"""`opdiff regressions`: steps and status changes over the whole history, attributed to the
environment change, on small synthetic histories whose planted changes are known."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers_history.planted import generate

from opdiff_snap.analytics import connect
from opdiff_snap.analytics.findings import REGRESSION, group_by_change
from opdiff_snap.analytics.steps import HistoryFilter, StepParams, detect, fit_steps
from opdiff_snap.cli import main


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    store = tmp_path_factory.mktemp("planted")
    return generate(store, runs=36, tests=25, envs=4, seed=3)


def _key(x):
    return (x.test_id, x.preset, x.kind, x.run_id)


def test_planted_changes_are_found_at_their_run(planted):
    with connect(planted.store) as a:
        found = detect(a)
    truth = {_key(p) for p in planted.planted}
    got = {_key(f) for f in found}
    hits = len(truth & got)
    assert hits / len(got) >= 0.95 and hits / len(truth) >= 0.95, (truth ^ got)
    by_run = {p.run_id: p for p in planted.planted}
    for f in found:   # the change named is the one between the runs on either side
        assert f.run_id in by_run and len(f.changes) == 1 and f.previous_run < f.run_id


def test_findings_group_by_the_version_change(planted):
    with connect(planted.store) as a:
        groups = group_by_change(detect(a))
    assert [g.change.split()[0] for g in groups] == ["torch", "onnxruntime", "executorch"]
    assert all(" -> " in g.change and g.lines() for g in groups)


def test_one_environment_has_no_findings(tmp_path):
    generate(tmp_path, runs=20, tests=25, envs=1, seed=4)
    res = CliRunner().invoke(main, ["--store", str(tmp_path), "regressions"])
    assert res.exit_code == 0, res.output
    assert "0 regressions" in res.output


def test_cli_json_filters_and_exit_status(planted):
    store = str(planted.store)
    res = CliRunner().invoke(main, ["--store", store, "regressions", "--format", "json"])
    assert res.exit_code == 1
    rows = json.loads(res.stdout)
    assert {r["kind"] for r in rows} <= {"latency", "status", "metric"} and rows
    assert any(r["direction"] == REGRESSION for r in rows)

    one = planted.planted[0].preset
    res = CliRunner().invoke(main, ["--store", store, "regressions", "-b", one, "--format", "json"])
    assert {r["preset"] for r in json.loads(res.stdout)} == {one}

    res = CliRunner().invoke(main, ["--store", store, "regressions", "--version", "onnxruntime", "--format", "csv"])
    lines = [line for line in res.stdout.splitlines() if line]
    assert lines[0].startswith("change,") and all(line.startswith("onnxruntime ") for line in lines[1:])

    res = CliRunner().invoke(main, ["--store", store, "regressions", "--test", "nothing*"])
    assert res.exit_code == 0 and "findings (0)" in res.output


def test_bad_parameter_is_one_paragraph(planted):
    res = CliRunner().invoke(main, ["--store", str(planted.store), "regressions", "--min-ratio", "0.5"])
    assert res.exit_code == 2
    assert "--min-ratio must be at least 1" in res.stderr and "Traceback" not in res.output


def test_fit_finds_one_clear_step_and_no_step_in_noise():
    rng = np.random.default_rng(0)
    levels = np.concatenate([rng.normal(0, 0.05, 5), rng.normal(0.7, 0.05, 5)])
    assert fit_steps(levels, np.ones(10), 0.05 ** 2, 10.0) == [5]
    assert fit_steps(rng.normal(0, 0.05, 10), np.ones(10), 0.05 ** 2, 10.0) == []


def test_a_step_smaller_than_the_noise_is_not_reported(planted):
    with connect(planted.store) as a:
        strict = detect(a, HistoryFilter(), StepParams(noise_k=50))
    assert not [f for f in strict if f.kind == "latency"]


def test_a_series_missing_from_a_run_keeps_one_environment_together(tmp_path):
    from helpers_history.synth import Res, Run, write_run

    P = "onnx_cpu_fp32"
    for i, (ort, tests) in enumerate([("1.31.1", ["a", "b"]), ("1.32.0", ["b"]), ("1.31.1", ["a", "b"])]):
        results = [Res(t, P, status="MISMATCH" if (t, i) == ("a", 2) else "PASS") for t in tests]
        write_run(tmp_path, Run(f"r{i}", f"2026-01-0{i + 1}T00:00:00Z", results, env={"onnxruntime": ort}))
    with connect(tmp_path) as a:
        found = detect(a)
    # a's two runs are one environment (the run between them did not hold a): nothing to attribute
    assert [f for f in found if f.test_id == "a"] == []
    assert all(f.changes for f in found)
