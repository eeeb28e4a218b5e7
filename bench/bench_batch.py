"""Batched compilation against exporting each test alone, on the shipped suites.

    python bench/bench_batch.py [-b onnx_cpu_fp32] [--batch 32 --batch 1] [-j 2]
                                [--suites 'suites/*.yaml'] [--upgrade] [--keep DIR]
                                [--preset-options '{"batch_program": true}']

For each --batch size (the first is the one compared against the others): a cold check
of the suites (empty artifact cache and history), a warm re-check over the cache it
filled, and, with --upgrade, a cold check again with only the cache's hints of which tests
failed kept (every artifact and failure record removed), as after a library upgrade,
which changes every cache key, all with the real CLI on the shipped goldens. Reports each check's wall (the whole
command), its verdict counts, the compile notice, and against the first size: whether
every item is the same apart from timings and ids (history/item_diff.py, as
tools/same_items.py compares), and the median
ratio of `infer_ms` over the tests whose artifact a batch compiled. Prints JSON with the
1-minute load average before each check.
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, run_timed

from opdiff_snap.history.item_diff import item_diff
from opdiff_snap.history.runs import read_run


def run_check(work: Path, preset: str, batch: int, jobs: int, suites: list[str], options: str = "") -> dict:
    before = load()
    cmd = [sys.executable, "-m", "opdiff_snap.cli", "--cache", str(work / "cache"), "--store", str(work / "store"),
           "check", "-b", preset, "-j", str(jobs), "--batch", str(batch), *suites]
    if options:
        cmd += ["--preset-options", f"{preset}={options}"]
    wall, proc = run_timed(cmd, cwd=ROOT)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    summary = next((line for line in proc.stdout.splitlines() if line.startswith("check ")), "")
    notice = next((line for line in proc.stdout.splitlines() if line.startswith("note: compiled")), "")
    runs = sorted((work / "store" / "runs").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    return {"wall_s": round(wall, 1), "load_1min": round(before, 2), "summary": summary, "compiled": notice,
            "run": str(runs[-1])}


def items(path: str) -> dict:
    return {(d["id"], d["seed"]): d for d in read_run(Path(path)).items}


def infer_ratio(batched: str, alone: str) -> dict:
    a, b = items(alone), items(batched)
    ratios = [b[k]["infer_ms"] / a[k]["infer_ms"] for k in b
              if b[k].get("batch") and k in a and a[k].get("infer_ms") and b[k].get("infer_ms")]
    if not ratios:
        return {"tests": 0}
    deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
    return {"tests": len(ratios), "median": round(statistics.median(ratios), 3),
            "p10": round(deciles[0], 3), "p90": round(deciles[-1], 3)}


def same_items(a: str, b: str) -> str:
    return item_diff(Path(a), Path(b)).lines(most=0)[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", "--backend", default="onnx_cpu_fp32")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--suites", default="suites/*.yaml", help="a glob under the repository root ('' : all)")
    ap.add_argument("--keep", type=Path, help="keep the stores and caches here")
    ap.add_argument("--upgrade", action="store_true", help="also a cold check keeping only the failure hints")
    ap.add_argument("--preset-options", default="", help="JSON options for the preset in every check "
                    "(ExecuTorch batches only with {\"batch_program\": true})")
    args = ap.parse_args()
    sizes = args.batch or [32, 1]
    suites = sorted(glob.glob(args.suites, root_dir=ROOT)) if args.suites else []
    base = args.keep or Path(tempfile.mkdtemp(prefix="opdiff-bench-batch-"))
    out: dict = {"preset": args.backend, "options": args.preset_options, "jobs": args.jobs,
                 "suites": args.suites or "all shipped", "sizes": {}}
    try:
        for size in sizes:
            work = base / f"batch{size}"
            shutil.rmtree(work, ignore_errors=True)
            cold = run_check(work, args.backend, size, args.jobs, suites, args.preset_options)
            warm = run_check(work, args.backend, size, args.jobs, suites, args.preset_options)
            warm["warm_over_cold"] = round(warm["wall_s"] / cold["wall_s"], 3)
            out["sizes"][size] = {"cold": cold, "warm": warm}
            if args.upgrade:
                cache = work / "cache"
                for entry in cache.iterdir():
                    if entry.name != "failures":
                        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
                for entry in (cache / "failures").iterdir():
                    if entry.name != "tests":
                        shutil.rmtree(entry)
                out["sizes"][size]["cold_after_upgrade"] = run_check(work, args.backend, size, args.jobs, suites,
                                                                      args.preset_options)
            print(json.dumps({size: out["sizes"][size]}), file=sys.stderr, flush=True)
        first = out["sizes"][sizes[0]]["cold"]["run"]
        for size in sizes[1:]:
            other = out["sizes"][size]["cold"]["run"]
            out["sizes"][size]["same_items_as_first"] = same_items(first, other)
            out["sizes"][size]["infer_ms_first_over_this"] = infer_ratio(first, other)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
