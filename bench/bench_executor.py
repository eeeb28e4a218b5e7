"""The local worker pool against the Ray executor on one machine, through the real CLI.

    python bench/bench_executor.py [--n 80] [--presets onnx_cpu_fp32,torch_cpu_fp32] [-j 2]

For each preset it runs `opdiff check` on the shipped goldens twice, the same selection
each time, with --no-cache (every ONNX / ExecuTorch job exports, as with a cold cache):
once with the local pool (`--executor local`) and once on a Ray instance the command
starts itself (`--executor ray`). The selection is every k-th test of the shipped suites
(n of the 530; --n 530 runs them all). Wall times include everything the command does
(interpreter, planning, starting workers or Ray and its actors). To tell the fixed cost
from the cost per job, each executor also runs the first test alone: the fixed cost is
the one-test wall, the cost per job (wall(n) - wall(1)) / (n - 1). Prints per preset: the
walls, the backends' own time (export + load + every inference call, from the run files),
Ray's extra cost per job and in fixed startup, and (Ray wall - local wall) / local wall
against the goal of at most 10 % on the export-heavy preset.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, run_timed

from opdiff_snap.history.runs import read_run


def selection(n: int) -> list[str]:
    from opdiff_snap.suite import discover_suites, load_suites

    ids = [c.id for c in load_suites(discover_suites(ROOT / "suites"))]
    step = max(1, len(ids) // n)
    return ids[::step][:n]


def run(executor: str, preset: str, ids: list[str], jobs: int, store: Path) -> tuple[float, dict]:
    before = set(store.glob("runs/*.jsonl"))
    cmd = [sys.executable, "-m", "opdiff_snap.cli", "--store", str(store), "check", "-b", preset,
           "--no-cache", "-j", str(jobs), "--executor", executor, "--test-ids", ";".join(ids)]
    wall, proc = run_timed(cmd, cwd=ROOT)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    (path,) = set(store.glob("runs/*.jsonl")) - before
    results = read_run(path).items
    backend_ms = sum((i.get("export_ms") or 0) + (i.get("load_ms") or 0) + sum(i.get("infer_ms_all") or [])
                     for i in results)
    counts: dict[str, int] = {}
    for i in results:
        counts[i["status"]] = counts.get(i["status"], 0) + 1
    return wall, {"jobs": len(results), "backend_s": backend_ms / 1e3, "counts": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=80)
    parser.add_argument("--presets", default="onnx_cpu_fp32,torch_cpu_fp32")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    ids = selection(args.n)
    print(f"{len(ids)} tests, -j {args.jobs}, load average {load():.2f}")
    with tempfile.TemporaryDirectory(prefix="opdiff-bench-") as tmp:
        store = Path(tmp) / "store"
        for preset in args.presets.split(","):
            local1, _ = run("local", preset, ids[:1], args.jobs, store)
            ray1, _ = run("ray", preset, ids[:1], args.jobs, store)
            local_wall, local = run("local", preset, ids, args.jobs, store)
            ray_wall, on_ray = run("ray", preset, ids, args.jobs, store)
            if local["counts"] != on_ray["counts"]:
                print(f"  note: verdict counts differ: local {local['counts']}, ray {on_ray['counts']}")
            n = local["jobs"]
            per_local, per_ray = (local_wall - local1) / (n - 1), (ray_wall - ray1) / (n - 1)
            print(f"{preset}: {n} jobs")
            print(f"  local pool: {local_wall:7.1f} s wall, backends {local['backend_s']:.1f} s; one test alone "
                  f"{local1:.1f} s, then {1e3 * per_local:.0f} ms per job")
            print(f"  Ray:        {ray_wall:7.1f} s wall, backends {on_ray['backend_s']:.1f} s; one test alone "
                  f"{ray1:.1f} s, then {1e3 * per_ray:.0f} ms per job")
            print(f"  Ray - local: fixed {ray1 - local1:+.1f} s, per job {1e3 * (per_ray - per_local):+.0f} ms "
                  f"({100 * (per_ray - per_local) / per_local:+.1f} %); whole run {ray_wall - local_wall:+.1f} s "
                  f"({100 * (ray_wall - local_wall) / local_wall:+.1f} %) (load average now {load():.2f})")


if __name__ == "__main__":
    main()
