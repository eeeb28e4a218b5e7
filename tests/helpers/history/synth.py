"""Writes history files in the documented format (docs/architecture.md, "History format")
without running anything, for the tests.

Its lines are written here rather than through `history.runs.RunWriter`: the writer takes
a run's id and start time from the clock (`RunWriter.start` is the only way to the meta
line) and stamps the end line with the time it is written, and these runs need chosen
ids and times."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opdiff_snap.compare.metrics import Metrics
from opdiff_snap.compare.results import Result
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite.model import Tolerance

ENV = {"python": "3.11.7", "torch": "2.13.0+cpu", "executorch": "1.5.1",
       "onnxruntime": "1.31.1", "onnx": "1.23.2", "coremltools": "9.0", "numpy": "2.4.6",
       "opdiff_snap": "0.1.0"}


@dataclass
class Res:
    """One result line: test x seed x preset (a results.Result with plausible filler)."""

    test_id: str
    preset: str
    status: str = Verdict.PASS.value
    infer_ms: float | None = 1.0
    infer_ms_all: list[float] | None = None
    max_abs: float | None = 0.0
    seed: int = 0
    atol: float = 1e-5
    suite: str = "suites/core.yaml"
    error_class: str | None = None
    error_message: str | None = None
    test_type: str = "op"
    quant: tuple[float, float] | None = None    # int8: (quant_sqnr, lowering_steps)

    def line(self, run_id: str, baseline: str, ts: str) -> dict[str, Any]:
        all_ = self.infer_ms_all if self.infer_ms_all is not None else (
            [self.infer_ms] if self.infer_ms is not None else [])
        metrics = None if self.max_abs is None else Metrics(
            max_abs=self.max_abs, mean_abs=self.max_abs / 2, mse=self.max_abs ** 2, max_rel=self.max_abs,
            mismatched=0 if Verdict(self.status) is Verdict.PASS else 1, numel=12, worst_index=(0, 1), worst_output="0",
            worst_expected=1.0, worst_actual=1.0 + self.max_abs, min_atol=self.max_abs,
            **({"quant_sqnr": self.quant[0], "lowering_steps": self.quant[1]} if self.quant else {}))
        result = Result(self.test_id, self.seed, self.preset, Verdict(self.status), self.error_message or "",
                        test_type=self.test_type, suite=self.suite, spec_hash="h-" + self.test_id,
                        baseline=baseline, error_class=self.error_class, export_ms=10.0, load_ms=1.0,
                        infer_ms=self.infer_ms, infer_ms_all=list(all_),
                        tolerance=Tolerance(self.atol, 1.3e-6), metrics=metrics)
        return {"type": "item", "run_id": run_id, **result.to_json(), "ts": ts}


@dataclass
class Run:
    run_id: str
    started: str                      # ISO, e.g. "2026-01-01T00:00:00Z"
    results: list[Res]
    env: dict[str, str] = field(default_factory=dict)   # overrides of ENV
    command: str = "check"
    baseline: str = "torch_cpu_fp32"
    complete: bool = True
    host: str = "box"


def write_run(store_dir: Path, run: Run, name: str | None = None) -> Path:
    """Write one run file into `<store_dir>/runs/` and return its path."""
    runs = Path(store_dir) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / (name or f"{run.run_id}.jsonl")
    presets = sorted({r.preset for r in run.results})
    meta = {"type": "meta", "run_id": run.run_id, "command": run.command,
            "argv": ["opdiff", run.command], "started": run.started, "host": run.host,
            "os": "Linux", "machine": "x86_64", "suites": ["suites/core.yaml"],
            "baseline_preset": run.baseline,
            "presets": {p: {"family": p.split("_")[0], "device": "cpu", "precision": "fp32",
                            "options": {}} for p in presets},
            "env": {**ENV, **run.env},
            "settings": {"jobs": 2, "repeats": 5, "warmup": 1, "timeout_s": 300,
                         "in_process": False, "cache": True}, "resumes": None}
    lines = [meta] + [r.line(run.run_id, run.baseline, run.started) for r in run.results]
    if run.complete:
        counts: dict[str, int] = {}
        for r in run.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        lines.append({"type": "end", "run_id": run.run_id, "finished": run.started,
                      "wall_s": 1.0, "counts": counts})
    with open(path, "w", encoding="utf-8") as f:
        for obj in lines:
            f.write(json.dumps(obj) + "\n")
    return path
