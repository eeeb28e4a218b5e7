"""int8 presets on the shipped models: the two errors, measured apart, and what set the
default lowering tolerance.

For each preset, one check of the suites with the lowering tolerance off (the preset
option `steps` set far out of reach), so every result shows its raw lowering error; then,
from the history, per preset:

- the counts by verdict (QUANTIZE_FAIL and the stage failures are findings, not noise);
- the quantization error: quant_sqnr (the quantized reference against the golden, dB),
  smallest / median / largest, and the tests below 20 dB;
- the lowering error: lowering_steps per result (how many results at 0, 1, 2, ... steps),
  its largest value, and the largest lowering_bias (mean signed error, in steps);
- how many results the preset's default tolerance (its option `steps`, and half a step of
  mean) would fail.

    python bench/bench_int8.py -j 2                          # models.yaml + the zoo, 8 presets
    python bench/bench_int8.py --suites suites/models.yaml --presets onnx_cpu_int8

Prints JSON; the history stays in --store (default a scratch folder) for queries.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ("executorch_cpu_int8,executorch_cpu_int8pt,executorch_cpu_int8dyn,onnx_cpu_int8,onnx_cpu_int8pt,"
           "onnx_cpu_int8dyn,inductor_cpu_int8,inductor_cpu_int8dyn")
OFF = 1e9          # the `steps` that no lowering error reaches
BIAS = 0.5


def check(store: Path, cache: Path, suites: list[str], preset: str, jobs: int, timeout_s: int) -> dict:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "--store", str(store), "--cache", str(cache),
                           "check", *suites, "-b", preset, "-j", str(jobs), "--repeats", "1",
                           "--timeout-s", str(timeout_s), "--preset-options", f'{preset}={{"steps": {OFF}}}'],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"check {preset} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    runs = sorted((store / "runs").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    return {"run": runs[-1].name.removesuffix(".jsonl"), "wall_s": round(time.perf_counter() - t0, 1),
            "load_1min": round(load, 2), "exit": proc.returncode}


def query(store: Path, run: str) -> list[dict]:
    sql = ("SELECT test_id, status, quant_sqnr, lowering_sqnr, lowering_steps, lowering_bias, quant_step, "
           f"error_message FROM results WHERE run_id = '{run}' ORDER BY test_id")
    out = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "--store", str(store), "query", sql,
                          "--format", "json"], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def _number(v) -> float | None:
    if v is None:
        return None
    return float(v) if not isinstance(v, str) else float(v.replace("Infinity", "inf"))


def summary(rows: list[dict], steps_allowed: float) -> dict:
    judged = [r for r in rows if r["lowering_steps"] is not None]
    sqnr = sorted(x for x in (_number(r["quant_sqnr"]) for r in judged) if x is not None and math.isfinite(x))
    steps = [_number(r["lowering_steps"]) for r in judged]
    bias = [_number(r["lowering_bias"]) or 0.0 for r in judged]
    failures = {r["test_id"]: f"{r['status']}: {(r['error_message'] or '')[:160]}" for r in rows
                if r["status"] not in ("PASS", "MISMATCH")}
    return {
        "counts": dict(Counter(r["status"] for r in rows)),
        "quant_sqnr_db": {"min": sqnr[0] if sqnr else None, "median": statistics.median(sqnr) if sqnr else None,
                          "max": sqnr[-1] if sqnr else None, "exact": len(judged) - len(sqnr),
                          "below_20": [r["test_id"] for r in judged
                                       if (_number(r["quant_sqnr"]) or math.inf) < 20]},
        "lowering_steps": {"histogram": dict(sorted(Counter(round(s) for s in steps).items())),
                           "max": max(steps, default=None), "max_bias": max(bias, default=None)},
        "default_tolerance_fails": [r["test_id"] for r, s, b in zip(judged, steps, bias)
                                    if s > steps_allowed + 1e-3 or b > BIAS],
        "failures": failures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=PRESETS)
    ap.add_argument("--suites", action="append", help="globs under the repository root "
                    "(default: suites/models.yaml and suites/zoo)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--timeout-s", type=int, default=900)
    ap.add_argument("--store", type=Path)
    args = ap.parse_args()
    suites = sorted(p for g in (args.suites or ["suites/models.yaml", "suites/zoo"])
                    for p in glob.glob(g, root_dir=ROOT))
    base = args.store or Path(tempfile.mkdtemp(prefix="opdiff-bench-int8-"))
    store, cache = base / "store", base / "cache"
    out: dict = {"suites": suites, "presets": {}}
    for preset in [p for p in args.presets.split(",") if p]:
        run = check(store, cache, suites, preset, args.jobs, args.timeout_s)
        from opdiff_snap.backends.registry import get_preset

        entry = {**run, **summary(query(store, run["run"]), float(get_preset(preset).options["steps"]))}
        out["presets"][preset] = entry
        print(json.dumps({preset: entry}), file=sys.stderr, flush=True)
    out["store"] = str(base)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
