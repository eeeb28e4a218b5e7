"""A warm re-check against a cold check, on a sample of the shipped suites.

    python bench/bench_recheck.py [--every 5] [-b onnx_cpu_fp32] [-j 2] [--opdiff CMD] [--out DIR]

Takes every `--every`-th test id of the hand-written shipped suites (core_aten, nn_modules,
models; `--every 1`: all 530), and runs the real CLI on the shipped goldens: a cold check
(empty artifact cache), then two warm re-checks over the cache it filled. Walls include
the whole command (interpreter, planning, workers). `--opdiff` runs another build of the
CLI (say, the previous commit's tree) for a before/after comparison of the JSONL with
tools/same_items.py. Prints a JSON summary with the 1-minute load average before each step,
and the median and largest `load_ms` of each check.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchlib import ROOT, load, newest_run, run_timed

from opdiff_snap.history.runs import read_run

SUITES = [ROOT / "suites" / name for name in ("core_aten.yaml", "nn_modules.yaml", "models.yaml")]


def sample(opdiff: list[str], every: int) -> list[str]:
    out = subprocess.run([*opdiff, "list-tests", *map(str, SUITES)], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    ids = [line.split()[0] for line in out.splitlines() if line.strip() and not line.startswith(("ok", " "))]
    return ids[::every]


def check(opdiff: list[str], ids: list[str], preset: str, jobs: int, work: Path) -> dict:
    before = load()
    wall, proc = run_timed([*opdiff, "--goldens", str(ROOT / "goldens"), "--store", str(work / "store"),
                            "--cache", str(work / "cache"), "check", *map(str, SUITES), "-b", preset,
                            "-j", str(jobs), "--test-ids", ";".join(ids), "--format", "json"], cwd=ROOT)
    if proc.returncode not in (0, 1):
        raise SystemExit(proc.stderr)
    run = newest_run(work / "store")
    items = read_run(run).items
    verdicts = Counter(d["status"] for d in items)
    cached_failures = sum(1 for d in items if d["status"] in ("EXPORT_FAIL", "LOAD_FAIL") and d.get("cache_hit"))
    loads = sorted(d["load_ms"] for d in items if d.get("load_ms") is not None)
    return {"wall_s": round(wall, 1), "load_1min": round(before, 2), "verdicts": dict(verdicts),
            "cached_failures": cached_failures, "run": str(run),
            "load_ms_median": round(loads[len(loads) // 2], 2) if loads else None,
            "load_ms_max": round(loads[-1], 2) if loads else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("-b", "--backend", default="onnx_cpu_fp32")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--opdiff", default=str(Path(sys.executable).with_name("opdiff")))
    ap.add_argument("--out", type=Path, default=None, help="keep the stores here (default: a temporary folder)")
    ap.add_argument("--cold-only", action="store_true")
    args = ap.parse_args()
    opdiff = shlex.split(args.opdiff)
    work = args.out or Path(tempfile.mkdtemp(prefix="opdiff-bench-recheck-"))
    shutil.rmtree(work / "cache", ignore_errors=True)
    ids = sample(opdiff, args.every)
    out: dict = {"tests": len(ids), "preset": args.backend, "jobs": args.j}
    out["cold"] = check(opdiff, ids, args.backend, args.j, work)
    if not args.cold_only:
        out["warm 1"] = check(opdiff, ids, args.backend, args.j, work)
        out["warm 2"] = check(opdiff, ids, args.backend, args.j, work)
        best = min(out["warm 1"]["wall_s"], out["warm 2"]["wall_s"])
        out["warm/cold"] = round(best / out["cold"]["wall_s"], 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
