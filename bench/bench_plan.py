"""A warm check of one test with every shipped suite on disk: what planning costs.

    python bench/bench_plan.py [-b torch_cpu_fp32 -b onnx_cpu_fp32] [--runs 3] [--jobs 1] [--before REV]

Runs `opdiff check -b PRESET --test-ids abs -j JOBS` in the repository root (its suites/ and
goldens/), with a fresh artifact cache and history store in a temporary folder: one check
to fill the cache, then `--runs` warm checks, timed whole (interpreter start, imports,
planning, the worker, the run). `--before REV` runs the same checks on the package as it
is at git revision REV (extracted with `git archive` into a temporary folder, put first on
PYTHONPATH), for a before/after comparison on the same machine. Prints JSON, with the
1-minute load average before each check.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, package_at, package_env, run_timed


def one_check(tree: Path, work: Path, preset: str, test_id: str, jobs: int) -> dict:
    before = load()
    env = package_env(tree)
    # -P: the package comes from `tree` (PYTHONPATH), not from the folder the check runs in
    cmd = [sys.executable, "-P", "-m", "opdiff_snap.cli", "--cache", str(work / "cache"), "--store",
           str(work / "store"), "check", "-b", preset, "--test-ids", test_id, "-j", str(jobs)]
    wall, proc = run_timed(cmd, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    verdicts = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("[1/1]")]
    return {"wall_s": round(wall, 2), "load_1min": round(before, 2), "verdicts": verdicts}


def measure(tree: Path, preset: str, runs: int, test_id: str, jobs: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="opdiff-bench-plan-"))
    try:
        first = one_check(tree, work, preset, test_id, jobs)
        warm = [one_check(tree, work, preset, test_id, jobs) for _ in range(runs)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    walls = sorted(w["wall_s"] for w in warm)
    return {"first": first, "warm": warm, "warm_median_s": walls[len(walls) // 2]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", "--backend", action="append", help="preset (repeatable; default torch_cpu_fp32)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--test-id", default="abs")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="the check's -j (2: what a 2-core machine defaults to)")
    ap.add_argument("--before", metavar="REV", help="also measure the package at this git revision")
    args = ap.parse_args()
    presets = args.backend or ["torch_cpu_fp32"]
    suites = sorted(p for p in (ROOT / "suites").rglob("*") if p.suffix in (".yaml", ".yml"))
    out: dict = {"command": f"opdiff check -b PRESET --test-ids {args.test_id} -j {args.jobs}", "cpus": os.cpu_count(),
                 "suite_files": len(suites), "suite_bytes": sum(p.stat().st_size for p in suites)}
    with package_at(args.before) as before:
        trees = {"before": before, "after": ROOT} if before is not None else {"after": ROOT}
        if before is not None:
            out["before"] = args.before
        for preset in presets:
            out[preset] = {name: measure(tree, preset, args.runs, args.test_id, args.jobs)
                           for name, tree in trees.items()}
            if "before" in trees:
                b, a = (out[preset][n]["warm_median_s"] for n in ("before", "after"))
                out[preset]["after/before"] = round(a / b, 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
