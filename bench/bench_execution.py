"""Execution benchmark: 20 small op tests on onnx_cpu_fp32, run several ways.

    python bench/bench_execution.py [--n 20] [--preset onnx_cpu_fp32]

Ways: persistent isolated workers (-j 1 and -j 2), one fresh `python -c` process per
job (spawn, import, export, run: the peer's isolation pattern), in-process, and a
warm-cache re-run (-j 2 over a cache filled by a cold -j 2 run). Each way runs every
job; wall time includes starting and stopping workers. Prints the wall times and the
ratios against the goals (isolated/in-process <= 1.3, warm/cold <= 0.1, j1/j2 >= 1.6).
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from benchlib import timed

# torch.onnx's exporter warns about a pytree deprecation on every export; keep the output
# readable (inherited by the worker and fresh processes through the environment)
os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
warnings.filterwarnings("ignore", category=FutureWarning)

import torch  # noqa: E402

from opdiff_snap.backends.registry import get_preset  # noqa: E402
from opdiff_snap.execution.pool import WorkerPool  # noqa: E402
from opdiff_snap.execution.runner import Job  # noqa: E402
from opdiff_snap.suite.model import Call, Invocation, TestCase  # noqa: E402

# (op, args builder) pairs; shapes are small so that the overheads dominate, as in a real suite
OPS = [
    ("aten::relu", lambda g: [torch.randn(8, 16, generator=g)]),
    ("aten::add.Tensor", lambda g: [torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)]),
    ("aten::mul.Tensor", lambda g: [torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)]),
    ("aten::sigmoid", lambda g: [torch.randn(8, 16, generator=g)]),
    ("aten::tanh", lambda g: [torch.randn(8, 16, generator=g)]),
    ("aten::exp", lambda g: [torch.randn(8, 16, generator=g)]),
    ("aten::mm", lambda g: [torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)]),
    ("aten::sum.dim_IntList", lambda g: [torch.randn(8, 16, generator=g), [1]]),
    ("aten::cat", lambda g: [[torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)], 0]),
    ("aten::softmax.int", lambda g: [torch.randn(8, 16, generator=g), 1]),
]


def make_jobs(n: int, preset_name: str, cache_dir: Path | None, tag: str) -> list[Job]:
    preset = get_preset(preset_name)
    suite = Path(__file__).resolve()
    jobs = []
    for i in range(n):
        op, build = OPS[i % len(OPS)]
        g = torch.Generator().manual_seed(i)
        case = TestCase(id=f"bench{i}_{op}", suite=suite, call=Call("op", op), inputs=(), kwargs={},
                        spec_hash=f"bench-{i}-{op}")
        inv = Invocation(args=build(g), kwargs={})
        jobs.append(Job(case=case, seed=0, invocation=inv, preset=preset, repeats=5, warmup=1,
                        cache_dir=cache_dir, key=f"{tag}{i}"))
    return jobs


def run_pool(jobs: list[Job], n_workers: int, in_process: bool = False) -> tuple[float, list]:
    def run() -> list:
        with WorkerPool(jobs=n_workers, timeout_s=300, in_process=in_process) as pool:
            return list(pool.run(jobs))

    outcomes, wall = timed(run)
    return wall, outcomes


FRESH_SNIPPET = """
import pickle, sys
from opdiff_snap.execution.runner import run_job
job = pickle.load(open(sys.argv[1], "rb"))
out = run_job(job)
pickle.dump(out, open(sys.argv[2], "wb"))
"""


def run_fresh(jobs: list[Job], tmp: Path) -> tuple[float, list]:
    """One new interpreter per job, one at a time (the peer's --timeout-s isolation)."""
    def one(i: int, job: Job):
        src, dst = tmp / f"job{i}.pkl", tmp / f"out{i}.pkl"
        src.write_bytes(pickle.dumps(job))
        subprocess.run([sys.executable, "-c", FRESH_SNIPPET, str(src), str(dst)], check=True)
        return pickle.loads(dst.read_bytes())

    outcomes, wall = timed(lambda: [one(i, job) for i, job in enumerate(jobs)])
    return wall, outcomes


def summarize(name: str, wall: float, outcomes: list) -> None:
    bad = [o for o in outcomes if o.status is not None]
    export = sum(o.export_ms or 0 for o in outcomes) / 1e3
    hits = sum(o.cache_hit for o in outcomes)
    print(f"{name:34s} wall {wall:7.2f} s   export total {export:6.2f} s   "
          f"cache hits {hits:2d}   failures {len(bad)}")
    for o in bad[:3]:
        print(f"    {o.key}: {o.status} {o.error_message[:200] if o.error_message else ''}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--preset", default="onnx_cpu_fp32")
    ap.add_argument("--skip-fresh", action="store_true", help="leave out the fresh-process way (slow)")
    a = ap.parse_args()
    print(f"{a.n} op tests on {a.preset}; {os.cpu_count()} cores; torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="opdiff-bench-") as tmp:
        tmp = Path(tmp)
        walls = {}
        walls["in-process"], outs = run_pool(make_jobs(a.n, a.preset, None, "ip"), 1, in_process=True)
        summarize("in-process", walls["in-process"], outs)
        walls["isolated -j 1"], outs = run_pool(make_jobs(a.n, a.preset, None, "j1"), 1)
        summarize("isolated workers -j 1", walls["isolated -j 1"], outs)
        walls["isolated -j 2"], outs = run_pool(make_jobs(a.n, a.preset, None, "j2"), 2)
        summarize("isolated workers -j 2", walls["isolated -j 2"], outs)
        cache = tmp / "cache"
        walls["cold -j 2"], outs = run_pool(make_jobs(a.n, a.preset, cache, "cold"), 2)
        summarize("cache cold -j 2", walls["cold -j 2"], outs)
        walls["warm -j 2"], outs = run_pool(make_jobs(a.n, a.preset, cache, "warm"), 2)
        summarize("cache warm -j 2", walls["warm -j 2"], outs)
        if not a.skip_fresh:
            walls["fresh"], outs = run_fresh(make_jobs(a.n, a.preset, None, "fresh"), tmp)
            summarize("fresh process per job", walls["fresh"], outs)

    def ratio(name: str, num: str, den: str, goal: str) -> None:
        print(f"{name:34s} {walls[num] / walls[den]:6.2f}x   (goal {goal})")

    print()
    ratio("isolated -j 1 / in-process", "isolated -j 1", "in-process", "<= 1.3")
    ratio("warm re-run / cold (-j 2)", "warm -j 2", "cold -j 2", "<= 0.1")
    ratio("-j 1 / -j 2 (speed-up)", "isolated -j 1", "isolated -j 2", ">= 1.6")
    if "fresh" in walls:
        ratio("fresh process per job / in-process", "fresh", "in-process", "peer pattern")
        ratio("fresh process per job / isolated -j 1", "fresh", "isolated -j 1", "")


if __name__ == "__main__":
    main()
