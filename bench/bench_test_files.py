"""What test files cost, wall and CPU, with the package as it is and as it was at a revision.

    python bench/bench_test_files.py [--before REV] [--runs 1] tests/test_check_cli.py ...

Runs `pytest -q` on the files in one process (no xdist), with this checkout's package, and
with `--before REV` also the package at REV (extracted with `git archive`, first on
PYTHONPATH; the tests are this checkout's). Wall and CPU (user + system, of pytest and every
process it started) per run, and the 1-minute load before each, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchlib import ROOT, load, package_at, package_env


def one_run(tree: Path, files: list[str]) -> dict:
    env = package_env(tree)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT / "tests")])
    before = load()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        raise SystemExit(f"pytest failed ({proc.returncode}): {last}\n{proc.stdout[-3000:]}")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load_1min": round(before, 2), "pytest": last}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--before", metavar="REV")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    out: dict = {"files": args.files}
    with package_at(args.before) as before:
        trees = {"before": before, "after": ROOT} if before is not None else {"after": ROOT}
        if before is not None:
            out["before"] = args.before
        for name, tree in trees.items():
            out[name] = [one_run(tree, args.files) for _ in range(args.runs)]
    if "before" in out:
        for key in ("wall_s", "cpu_s"):
            out[f"after/before {key}"] = round(min(r[key] for r in out["after"])
                                               / min(r[key] for r in out["before"]), 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
