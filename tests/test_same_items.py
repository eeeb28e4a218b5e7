"""tools/same_items.py (history/item_diff.py): two run files whose items differ only in what
differs between runs by nature are the same; a changed status is reported, exit 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from opdiff_snap.history.item_diff import item_diff

TOOL = Path(__file__).resolve().parents[1] / "tools" / "same_items.py"


def _run(path: Path, run_id: str, pid: int, status: str = "CRASH", **extra) -> Path:
    item = {"type": "item", "run_id": run_id, "id": "add__x", "seed": 0, "preset": "onnx_cpu_fp32",
            "status": status, "export_ms": pid / 7, "infer_ms_all": [pid / 3], "cache_hit": pid % 2 == 0,
            "batch": pid % 5, "ts": f"2026-01-0{pid % 9 + 1}T00:00:00Z",
            "error_message": f"worker died (pid {pid}) at 0x7fd27fb4{pid:04x} in /tmp/w{pid}/x.py"
                             f"\nbackend output:\nI1207 10:0{pid % 9}:00.123 {pid} cut...",
            "metrics": {"max_abs": 0.5, "load_ms": pid / 11}, **extra}
    lines = [{"type": "meta", "run_id": run_id, "command": "check", "started": "2026-01-01T00:00:00Z"}, item,
             {"type": "end", "run_id": run_id, "wall_s": pid / 13}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_timings_and_ids_apart_the_items_are_the_same(tmp_path):
    a = _run(tmp_path / "a.jsonl", "r1", 4242)
    b = _run(tmp_path / "b.jsonl", "r2", 5151, expected=None)
    assert item_diff(a, b).same
    proc = subprocess.run([sys.executable, str(TOOL), str(a), str(b)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_changed_status_is_reported(tmp_path):
    a = _run(tmp_path / "a.jsonl", "r1", 4242)
    b = _run(tmp_path / "b.jsonl", "r2", 4242, status="TIMEOUT")
    diff = item_diff(a, b)
    assert list(diff.differing.values()) == [{"status": ("CRASH", "TIMEOUT")}]
    proc = subprocess.run([sys.executable, str(TOOL), str(a), str(b)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "('add__x', 0, 'onnx_cpu_fp32') status: 'CRASH' != 'TIMEOUT'" in proc.stdout


def test_the_tools_own_call_line_and_the_runtimes_output_are_left_out_but_not_our_survey(tmp_path):
    survey = "\nopdiff: every ATen op of its graph lowers alone"

    def source(line: int, call: str) -> dict:
        return {"sources": [f"prepare.py:{line} in forward: {call}(self._fn(side)(*args), flat)"],
                "source_paths": [f"/src/a{line}/opdiff_snap/execution/prepare.py:{line}"]}

    a = _run(tmp_path / "a.jsonl", "r1", 4242, unsupported_ops=[source(94, "_collect")],
             error_message="UserError: x" + survey)
    b = _run(tmp_path / "b.jsonl", "r2", 5151, unsupported_ops=[source(85, "collect_outputs")],
             error_message="UserError: x\nbackend output: WARNING:root:Error in get_fake_program\n  def forward():"
                           + survey)
    assert item_diff(a, b).same
    c = _run(tmp_path / "c.jsonl", "r3", 5151, unsupported_ops=[source(85, "collect_outputs")],
             error_message="UserError: x\nbackend output: WARNING:root:Error")
    assert list(item_diff(a, c).differing.values()) == [{"error_message": ("UserError: x" + survey, "UserError: x")}]
