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
    return json.loads((root / "goldens" / "zarr.json").read_text())["attributes"].get("baseline_failures", {})


@pytest.mark.slow
def test_check_says_baseline_fail_with_the_recorded_reason(tmp_path):
    root = _project(tmp_path)
    with contextlib.chdir(root):
        recorded = api.record(settings=SETTINGS)
        assert recorded.counts() == {"RECORDED": 1, "BASELINE_FAIL": 2}
        # the unreadable output failed its own job; the run went on and recorded the rest
        why = {r.test_id: r.message for r in recorded.results}
        assert "cannot be read back" in why["unreadable"]
        assert sorted(f["test_id"] for f in _failures(root).values()) == ["raises", "unreadable"]

        checked = api.check(backends=["torch_cpu_fp32"], settings=SETTINGS)
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
        api.record(settings=SETTINGS, in_process=True, test_ids=["raises"])
        assert list(_failures(root)) and _failures(root)[next(iter(_failures(root)))]["test_id"] == "raises"
        fixed = SUITE.replace("{type: scalar_tensor, dtype: float32, value: 3.0}",
                              "{type: const_tensor, shape: [1], dtype: float32, value: [3.0]}")
        _project(root, fixed)
        checked = api.check(backends=["torch_cpu_fp32"], settings=SETTINGS, in_process=True, test_ids=["raises"])
        assert [r.verdict.value for r in checked.results] == ["NO_GOLDEN"]   # it changed since
        assert api.record(settings=SETTINGS, in_process=True, test_ids=["raises"]).counts() == {"RECORDED": 1}
        assert _failures(root) == {}
        checked = api.check(backends=["torch_cpu_fp32"], settings=SETTINGS, in_process=True, test_ids=["raises"])
        assert [r.verdict.value for r in checked.results] == ["PASS"]
