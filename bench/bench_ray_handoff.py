"""What the Ray executor adds to each job, apart from its fixed start: the same batches of
small jobs through a local WorkerPool and a RayPool, both started (and warmed) first.

    python bench/bench_ray_handoff.py [--n 20] [--rounds 3] [--preset onnx_cpu_fp32] [-j 2] [--judge-ms 0]

Both pools live in this process for the whole run: a Ray instance of its own with `-j`
CPUs and `-j` local workers. One untimed batch through each warms them (torch, the
backend, the actors). Then `--rounds` timed batches of `--n` jobs (bench_execution.py's
small op jobs, no artifact cache: every ONNX or ExecuTorch job exports) alternate between
the two pools; `--judge-ms` makes the consumer spend that long on each result, as check
does judging it. Prints the wall per job of each pool (median over rounds), Ray's extra
time per job in ms and percent, and the 1-minute load average before and after.
Run it with PYTHONPATH on another tree to measure that tree's RayPool.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_execution import make_jobs
from benchlib import load, timed

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.execution.pool import WorkerPool
from opdiff_snap.execution.ray_pool import RayPool


def batch(pool, n: int, preset: str, tag: str, judge_s: float) -> float:
    jobs = make_jobs(n, preset, None, tag)

    def run() -> int:
        failed = 0
        for outcome in pool.run(jobs):
            failed += outcome.status is not None
            if judge_s:
                time.sleep(judge_s)
        return failed

    failed, wall = timed(run)
    if failed:
        raise SystemExit(f"{failed} of {n} jobs failed on {type(pool).__name__}")
    return wall / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--preset", default="onnx_cpu_fp32")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--judge-ms", type=float, default=0.0)
    args = ap.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    preset = get_preset(args.preset)
    print(f"load average before: {load():.2f}; {args.n} jobs x {args.rounds} rounds on {args.preset}, "
          f"-j {args.j}, judging {args.judge_ms:g} ms per result", flush=True)
    per_job: dict[str, list[float]] = {"local": [], "ray": []}
    with WorkerPool(jobs=args.j, timeout_s=300) as local, RayPool(None, jobs=args.j, timeout_s=300) as ray:
        local.prestart([preset])
        ray.prestart([preset])
        judge_s = args.judge_ms / 1e3
        batch(local, args.j * 2, args.preset, "wl", 0)
        batch(ray, args.j * 2, args.preset, "wr", 0)
        for r in range(args.rounds):
            for name, pool in (("local", local), ("ray", ray)):
                per_job[name].append(batch(pool, args.n, args.preset, f"{name}{r}_", judge_s))
                print(f"  round {r + 1} {name}: {per_job[name][-1] * 1e3:.0f} ms per job "
                      f"(load {load():.2f})", flush=True)
    lo, ry = statistics.median(per_job["local"]), statistics.median(per_job["ray"])
    print(f"median per job: local {lo * 1e3:.0f} ms, Ray {ry * 1e3:.0f} ms; Ray adds {(ry - lo) * 1e3:+.0f} ms "
          f"({(ry / lo - 1) * 100:+.1f} %; goal <= +10 %)")
    print(f"load average after: {load():.2f}")


if __name__ == "__main__":
    main()
