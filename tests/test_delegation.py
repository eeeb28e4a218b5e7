"""Delegation on ExecuTorch: every result of a delegating preset records, per op, the nodes
the delegate took and those left on the portable kernels (with their source lines); the
summary and SQL show it; --require-delegated (or the preset option) fails a fallback with
its own verdict; diff-runs reports ops that left or joined the delegate between two runs
(here two partitioner settings under one preset name)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers.lowering import SUITE, line_of

from opdiff_snap import api
from opdiff_snap.analytics.reports import diff_runs
from opdiff_snap.cli import main
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict

PRESET = "executorch_cpu_fp32"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The fallback test recorded, checked with the XNNPACK delegate, then without it."""
    root = tmp_path_factory.mktemp("delegation")
    settings = Settings(suites=SUITE.parent, goldens=root / "goldens", store=root / "store", cache=root / "cache",
                        jobs=1, repeats=1)
    api.record(api.RecordRequest(selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                 running=api.Running(in_process=True)), settings=settings)
    with_delegate = api.check(api.CheckRequest(backends=[PRESET],
                                               selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                               running=api.Running(in_process=True)), settings=settings)
    without = api.check(api.CheckRequest(backends=[PRESET],
                                         selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                         running=api.Running(in_process=True),
                                         preset_options={PRESET: {"delegate": False}}), settings=settings)
    return settings, with_delegate, without


@pytest.mark.slow
def test_each_result_records_which_ops_the_delegate_took_and_where_the_rest_come_from(runs):
    _, report, _ = runs
    (r,) = report.results
    assert r.verdict is Verdict.PASS, r.message      # a fallback is information, not a failure
    d = r.delegation
    assert d is not None and d.blobs >= 1 and "Xnnpack" in d.delegate
    ops = {o.op: o for o in d.ops}
    assert ops["aten::cumsum.default"].fallback == 1 and ops["aten::cumsum.default"].delegated == 0
    assert ops["aten::cumsum.default"].sources == [
        f"models.py:{line_of('# off the delegate: cumsum')} in forward: "
        "c = torch.cumsum(h, dim=-1)               # off the delegate: cumsum"]
    assert ops["aten::linear.default"].delegated == 1 and ops["aten::linear.default"].fallback == 0
    assert 0 < d.fraction < 1


def test_the_history_lists_the_fallback_ops_with_their_models(runs):
    settings, report, _ = runs
    table = api.query(f"""SELECT o.op, sum(o.fallback) AS nodes, list(DISTINCT test_id) AS tests
                          FROM results, unnest(delegation.ops) AS t(o)
                          WHERE o.fallback > 0 AND run_id = '{report.run_id}'
                          GROUP BY o.op ORDER BY nodes DESC, o.op LIMIT 10""", settings)
    assert table.rows == [("aten::cumsum.default", 1, ["fallback"])]


def test_without_a_delegate_every_op_falls_back_and_diff_runs_says_which_left_it(runs):
    settings, a, b = runs
    (rb,) = b.results
    assert rb.verdict is Verdict.PASS and rb.delegation is not None
    assert rb.delegation.blobs == 0 and rb.delegation.delegated == 0
    diff = diff_runs(settings.store, a.run_id, b.run_id)
    left = {row[3]: row for row in diff.delegation.rows}
    # the delegate kept linear whole; without it, linear is decomposed to permute_copy + addmm
    assert set(left) == {"aten::permute_copy.default", "aten::addmm.default", "aten::add.Tensor",
                         "aten::relu.default"}
    assert all(row[6] == "left the delegate" for row in left.values())
    assert "4 delegation changes" in diff.summary()
    back = diff_runs(settings.store, b.run_id, a.run_id)
    assert {row[6] for row in back.delegation.rows} == {"joined the delegate"}


def test_require_delegated_fails_a_fallback_with_its_own_verdict(runs):
    settings, _, _ = runs
    base = ["--suites", str(SUITE.parent), "--goldens", str(settings.goldens), "--store", str(settings.store),
            "--cache", str(settings.cache), "check", str(SUITE), "--test-ids", "fallback", "-b", PRESET,
            "--in-process", "--repeats", "1"]
    plain = CliRunner().invoke(main, base)
    assert plain.exit_code == 0, plain.output
    assert "took" in plain.stdout and "fell back: cumsum.default x1 in 1 test (models.py:" in plain.stdout
    strict = CliRunner().invoke(main, [*base, "--require-delegated"])
    assert strict.exit_code == 1, strict.output
    assert "NOT_DELEGATED" in strict.stdout and "aten::cumsum.default x1" in strict.stdout
    by_option = api.check(api.CheckRequest(backends=[PRESET],
                                           selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                           running=api.Running(in_process=True),
                                           preset_options={PRESET: {"require_delegated": True}}), settings=settings)
    (r,) = by_option.results
    assert r.verdict is Verdict.NOT_DELEGATED and "stayed off the" in r.message


def test_the_portable_device_delegates_nothing_and_records_nothing(runs):
    settings, _, _ = runs
    report = api.check(api.CheckRequest(backends=["executorch_portable_fp32"],
                                        selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                        running=api.Running(in_process=True)), settings=settings)
    (r,) = report.results
    assert r.verdict is Verdict.PASS and r.delegation is None


def _evidence(settings) -> list:
    """The delegation.json of the artifact made with the delegate on (the one that took ops)."""
    import json
    from pathlib import Path

    found = []
    for path in sorted(Path(settings.cache).rglob("delegation.json")):
        try:
            took = any(op.get("delegated") for op in json.loads(path.read_text()).get("ops", []))
        except (ValueError, AttributeError):
            took = False
        if took:
            found.append(path)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["[1]", "{not json", '{"delegate": "XnnpackBackend", "blobs": "many"}'])
def test_unreadable_delegation_evidence_is_never_a_pass(runs, planted):
    """A cached artifact whose delegation.json is not what export wrote is rebuilt, so the
    verdict rests on real evidence (the fallback is NOT_DELEGATED, never a PASS)."""
    settings, _, _ = runs
    for evidence in _evidence(settings):
        evidence.write_text(planted)
    assert not _evidence(settings)
    # in this process: what is judged here is the cache's evidence, not a worker's life
    report = api.check(api.CheckRequest(backends=[PRESET],
                                        selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                        running=api.Running(in_process=True), require_delegated=True),
                                        settings=settings)
    (r,) = report.results
    assert r.verdict is Verdict.NOT_DELEGATED and r.delegation is not None and r.delegation.fallback
    assert not r.cache_hit                                 # rebuilt
    assert api.check(api.CheckRequest(backends=[PRESET],
                                      selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                      running=api.Running(in_process=True)), settings=settings).results[0].cache_hit


def test_evidence_that_cannot_be_read_even_fresh_is_its_own_verdict(runs, monkeypatch, tmp_path):
    from opdiff_snap.backends.executorch import ExecuTorchBackend

    settings, _, _ = runs

    def unreadable(self, artifact, preset):
        raise ValueError("delegation.json is garbled")

    monkeypatch.setattr(ExecuTorchBackend, "delegation", unreadable)
    report = api.check(api.CheckRequest(backends=[PRESET],
                                        selection=api.Selection(suites=[SUITE], test_ids=["fallback"]),
                                        running=api.Running(in_process=True, use_cache=False),
                                        require_delegated=True), settings=settings)
    (r,) = report.results
    assert r.verdict is Verdict.NOT_DELEGATED and "could not be read (ValueError: delegation.json is garbled)" \
        in r.message, r.message


def test_a_huge_delegate_name_is_cut(runs):
    import json

    settings, _, _ = runs
    for evidence in _evidence(settings):
        data = json.loads(evidence.read_text())
        data["delegate"] = "X" * 1_000_000
        evidence.write_text(json.dumps(data))
    res = CliRunner().invoke(main, ["--suites", str(SUITE.parent), "--goldens", str(settings.goldens), "--store",
                                    str(settings.store), "--cache", str(settings.cache), "check", str(SUITE),
                                    "--test-ids", "fallback", "-b", PRESET, "--in-process", "--repeats", "1"])
    assert res.exit_code == 0, res.output[-2000:]
    assert len(res.output) < 20_000 and "more characters]" in res.output
    lines = sorted(settings.store.glob("runs/*.jsonl"))[-1].read_text().splitlines()
    assert max(len(line) for line in lines) < 50_000


def test_require_delegated_on_a_preset_that_never_delegates_says_so(runs):
    settings, _, _ = runs
    res = CliRunner().invoke(main, ["--suites", str(SUITE.parent), "--goldens", str(settings.goldens), "--store",
                                    str(settings.store), "--cache", str(settings.cache), "check", str(SUITE),
                                    "--test-ids", "fallback", "-b", "executorch_portable_fp32", "--in-process",
                                    "--repeats", "1", "--require-delegated"])
    assert res.exit_code == 0, res.output
    assert res.output.count("executorch_portable_fp32 never hands a program to a delegate") == 1
