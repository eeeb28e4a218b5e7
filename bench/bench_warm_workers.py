"""The first export in a worker against the median export, with and without the workers'
warm-up (a tiny export through the run's backend before their hello).

    python bench/bench_warm_workers.py [--n 20] [--preset onnx_cpu_fp32] [-j 2] [--plan-s 3]

Each way runs the same `--n` small op jobs (bench_execution.py's) with no artifact cache,
so every job exports, in a fresh pool of `-j` workers. The parent sleeps `--plan-s` seconds
after starting the workers, as a check plans (loads suites, reads the golden index) while
they start; the wall includes it. Prints, per way, the first export of each worker, the
median of the others, their ratio, and the wall; and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench_execution import make_jobs
from benchlib import load, timed

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.execution.pool import WorkerPool


def one_way(n: int, preset: str, workers: int, plan_s: float, warm: bool, tag: str) -> dict:
    jobs = make_jobs(n, preset, None, tag)

    def run() -> list:
        with WorkerPool(jobs=workers, timeout_s=300) as pool:
            pool.prestart([get_preset(preset)] if warm else [])
            time.sleep(plan_s)
            return list(pool.run(jobs))

    outcomes, wall = timed(run)
    first: dict[int, float] = {}
    rest: list[float] = []
    for o in outcomes:   # completion order: a worker's first result is its first job
        if o.export_ms is None:
            continue
        if o.worker_pid not in first:
            first[o.worker_pid] = o.export_ms
        else:
            rest.append(o.export_ms)
    median = statistics.median(rest) if rest else float("nan")
    return {"first_export_ms": sorted(round(v, 1) for v in first.values()), "median_export_ms": round(median, 1),
            "first/median": round(max(first.values()) / median, 2) if first and rest else None,
            "wall_s": round(wall, 2), "failed": sum(o.status is not None for o in outcomes)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--preset", default="onnx_cpu_fp32")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--plan-s", type=float, default=3.0)
    args = ap.parse_args()
    out = {"load_1min_before": load()}
    out["cold workers (no warm-up)"] = one_way(args.n, args.preset, args.j, args.plan_s, False, "c")
    out["warm workers"] = one_way(args.n, args.preset, args.j, args.plan_s, True, "w")
    out["load_1min_after"] = load()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
