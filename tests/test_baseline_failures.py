"""A test whose baseline fails at record: record says BASELINE_FAIL and the golden store
remembers why, so check says BASELINE_FAIL with that reason (never NO_GOLDEN with advice
to record again) until the test changes or records; a worker whose result cannot be read
back fails its job, not the run."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.cli import MODULE

from opdiff_snap import api
from opdiff_snap.cli import main
from opdiff_snap.core.config import Settings

CALL = "opdiff_snap.suite.torch_call.TorchCall"
SUITE = f"""
tests:
  - id: fine
    op: {{type: module, path: {CALL}, kwargs: {{fn: torch.add, args: [{{input: 0}}, {{input: 1}}]}}}}
    in: [{{type: const_tensor, shape: [2], dtype: float32, value: [1.0, 2.0]}},
         {{type: const_tensor, shape: [2], dtype: float32, value: [0.5, 0.25]}}]
  - id: raises
    op: {{type: module, path: {CALL}, kwargs: {{fn: torch.cat, args: [[{{input: 0}}, {{input: 1}}]]}}}}
    in: [{{type: const_tensor, shape: [2], dtype: float32, value: [1.0, 2.0]}},
         {{type: scalar_tensor, dtype: float32, value: 3.0}}]
  - id: unreadable
    op: {{type: module, path: {CALL}, kwargs: {{fn: torch.hash_tensor, args: [{{input: 0}}]}}}}
    in: [{{type: const_tensor, shape: [3], dtype: float32, value: [1.0, 2.0, 3.0]}}]
"""
SETTINGS = Settings(repeats=1, warmup=0, jobs=1)


def _project(tmp_path: Path, text: str = SUITE) -> Path:
    (tmp_path / "suites").mkdir(parents=True, exist_ok=True)
    (tmp_path / "suites" / "s.yaml").write_text(text)
    return tmp_path


def _failures(root: Path) -> dict:
    """The ledger as stored: golden key -> entry."""
    return {p.stem: json.loads(p.read_text()) for p in (root / "goldens" / ".baseline-failures").glob("*.json")}


@pytest.mark.slow
def test_check_says_baseline_fail_with_the_recorded_reason(tmp_path):
    root = _project(tmp_path)
    with contextlib.chdir(root):
        recorded = api.record(api.RecordRequest(), settings=SETTINGS)
        assert recorded.counts() == {"RECORDED": 1, "BASELINE_FAIL": 2}
        # the unreadable output failed its own job; the run went on and recorded the rest
        why = {r.test_id: r.message for r in recorded.results}
        assert "cannot be read back" in why["unreadable"]
        assert sorted(f["test_id"] for f in _failures(root).values()) == ["raises", "unreadable"]

        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"]), settings=SETTINGS)
        by_id = {r.test_id: r for r in checked.results}
        assert by_id["fine"].verdict.value == "PASS"
        for test_id in ("raises", "unreadable"):
            r = by_id[test_id]
            assert r.verdict.value == "BASELINE_FAIL", r
            assert "failed on this test when it was recorded" in r.message
            assert "run `opdiff record`" in r.message and "no golden recorded" not in r.message
        assert "zero-dimensional" in by_id["raises"].message or "cat" in by_id["raises"].message

        res = CliRunner().invoke(main, ["check", "-b", "torch_cpu_fp32", "-j", "1"])
        assert res.exit_code == 1
        assert "BASELINE_FAIL" in res.output and "Traceback" not in res.output


def test_a_changed_or_fixed_test_is_no_longer_called_failed(tmp_path):
    root = _project(tmp_path)
    with contextlib.chdir(root):
        api.record(api.RecordRequest(selection=api.Selection(test_ids=["raises"]),
                                     running=api.Running(in_process=True)), settings=SETTINGS)
        assert list(_failures(root)) and _failures(root)[next(iter(_failures(root)))]["test_id"] == "raises"
        fixed = SUITE.replace("{type: scalar_tensor, dtype: float32, value: 3.0}",
                              "{type: const_tensor, shape: [1], dtype: float32, value: [3.0]}")
        _project(root, fixed)
        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"],
                                             selection=api.Selection(test_ids=["raises"]),
                                             running=api.Running(in_process=True)), settings=SETTINGS)
        assert [r.verdict.value for r in checked.results] == ["NO_GOLDEN"]   # it changed since
        assert api.record(api.RecordRequest(selection=api.Selection(test_ids=["raises"]),
                                            running=api.Running(in_process=True)), settings=SETTINGS).counts() == {"RECORDED": 1}
        assert _failures(root) == {}
        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"],
                                             selection=api.Selection(test_ids=["raises"]),
                                             running=api.Running(in_process=True)), settings=SETTINGS)
        assert [r.verdict.value for r in checked.results] == ["PASS"]


BAD_TEST = """\
  - id: {}
    op: {{type: module, path: opdiff_snap.suite.torch_call.TorchCall, kwargs: {{fn: torch.cat, args: [[{{input: 0}}, {{input: 1}}]]}}}}
    in: [{{type: const_tensor, shape: [2], dtype: float32, value: [1.0, 2.0]}}, {{type: scalar_tensor, dtype: float32, value: 3.0}}]
"""
FAILING = "tests:\n" + "".join(BAD_TEST.format(f"bad{i:02d}") for i in range(16))


@pytest.mark.slow
def test_two_concurrent_records_lose_no_baseline_failure(tmp_path):
    """Two `opdiff record` on one store, disjoint tests that all fail on the baseline: every
    failure is remembered (one entry each, no read-modify-write of a shared object), check
    says BASELINE_FAIL for all 16, and the writers leave nothing behind."""
    import subprocess

    root = _project(tmp_path, FAILING)
    cli = [*MODULE, "record", "-j", "1", "--repeats", "1", "--warmup", "0"]
    procs = [subprocess.Popen([*cli, "--test-ids", ";".join(f"bad{i:02d}" for i in range(k, 16, 2))], cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 1 for p in procs), outs      # BASELINE_FAIL is a failing result
    assert sorted(f["test_id"] for f in _failures(root).values()) == [f"bad{i:02d}" for i in range(16)]
    with contextlib.chdir(root):
        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True)),
                                             settings=SETTINGS)
    assert checked.counts() == {"BASELINE_FAIL": 16}
    goldens = root / "goldens"
    assert sorted(p.name for p in (goldens / ".staging").iterdir()) == ["zarr.json"]   # its own group, no debris
    assert not [p for p in (goldens / ".baseline-failures").iterdir() if p.name.startswith(".")]


def _root_attrs(root: Path, change) -> None:
    meta = root / "goldens" / "zarr.json"
    body = json.loads(meta.read_text())
    change(body["attributes"])
    meta.write_text(json.dumps(body))


@pytest.mark.parametrize("ledger, says", [
    ([1, 2], "the root attribute baseline_failures is a list"),
    ("everything failed", "the root attribute baseline_failures is a str"),
    ({"KEY": {"test_id": "raises", "seed": 0, "spec_hash": "x", "baseline": "torch_cpu_fp32", "reason": 5,
              "at": "2026-01-01T00:00:00Z"}}, "its reason is int, not str"),
    ({"KEY": {"test_id": "raises", "seed": 0, "spec_hash": "x", "baseline": "torch_cpu_fp32", "reason": "r",
              "at": 7}}, "its at is int, not str"),
])
def test_a_hostile_ledger_is_named_and_left_out(tmp_path, ledger, says):
    """A ledger that is not what record writes breaks neither check nor record: its bad
    entries are left out, `goldens verify` names them (exit 1), and record repairs it."""
    from opdiff_snap.goldens import store_key

    root = _project(tmp_path)
    with contextlib.chdir(root):
        api.record(api.RecordRequest(selection=api.Selection(test_ids=["fine"]),
                                     running=api.Running(in_process=True)), settings=SETTINGS)
        key = store_key("raises", 0)
        planted = {key: next(iter(ledger.values()))} if isinstance(ledger, dict) else ledger
        _root_attrs(root, lambda a: a.update(baseline_failures=planted))
        with pytest.warns(RuntimeWarning, match="the golden store's baseline failures: "):
            checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True)),
                                                 settings=SETTINGS)
        assert {r.test_id: r.verdict.value for r in checked.results} == {"fine": "PASS", "raises": "NO_GOLDEN",
                                                                         "unreadable": "NO_GOLDEN"}
        res = CliRunner().invoke(main, ["goldens", "verify"])
        assert res.exit_code == 1 and says in res.output and "Traceback" not in res.output, res.output
        assert api.record(api.RecordRequest(selection=api.Selection(test_ids=["raises"]),
                                            running=api.Running(in_process=True)), settings=SETTINGS).counts() == {"BASELINE_FAIL": 1}
        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"],
                                             selection=api.Selection(test_ids=["raises"]),
                                             running=api.Running(in_process=True)), settings=SETTINGS)
        assert [r.verdict.value for r in checked.results] == ["BASELINE_FAIL"]


def test_a_huge_stored_reason_is_capped(tmp_path):
    from opdiff_snap.goldens import GoldenStore, store_key
    from opdiff_snap.goldens.ledger import REASON_MAX_CHARS

    root = _project(tmp_path)
    with contextlib.chdir(root):
        api.record(api.RecordRequest(selection=api.Selection(test_ids=["raises"]),
                                     running=api.Running(in_process=True)), settings=SETTINGS)
        entry = root / "goldens" / ".baseline-failures" / f"{store_key('raises', 0)}.json"
        raw = json.loads(entry.read_text())
        raw["reason"] = "x" * 60_000
        entry.write_text(json.dumps(raw))
        failure = GoldenStore(root / "goldens").baseline_failures()[store_key("raises", 0)]
        assert len(failure.reason) < REASON_MAX_CHARS + 50
        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"],
                                             selection=api.Selection(test_ids=["raises"]),
                                             running=api.Running(in_process=True)), settings=SETTINGS)
        assert checked.results[0].verdict.value == "BASELINE_FAIL"
        assert len(checked.results[0].message) < REASON_MAX_CHARS + 1000
