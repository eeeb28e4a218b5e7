"""Benchmark `opdiff record` on a generated suite of N small op tests (default 520).

    python bench/bench_record.py [--n 520] [-j 2] [--repeats 1] [--keep DIR]

Runs the real thing in-process through the API (worker pool, torch_cpu_fp32 baseline)
on a suite of ~20 elementwise / reduction ops x shapes written into a temp project, with
GoldenStore.write wrapped to time it. Reports:
- record wall, per-test cost, and the golden store's share of the wall (time inside
  GoldenStore.write; goal <= 5%), plus the metadata look-ups that decide KEPT vs record;
- a second record of the same suite (everything KEPT): the cost of deciding alone;
- reading one golden in a fresh process after its imports (goal <= 10 ms; median of 5).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import timed

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.goldens import GoldenStore

UNARY = ["neg", "abs", "relu", "sigmoid", "tanh", "exp", "sin", "cos", "sqrt", "reciprocal"]
BINARY = ["add.Tensor", "sub.Tensor", "mul.Tensor", "maximum", "minimum", "atan2"]
REDUCE = ["sum.dim_IntList", "mean.dim", "amax", "amin"]
SHAPES = [[n] for n in (1, 7, 64, 1000)] + [[a, b] for a in (2, 8, 31) for b in (3, 16, 32)] + \
         [[2, 3, 4], [4, 8, 16], [1, 5, 5], [3, 1, 7], [2, 16, 16], [8, 8, 8], [6, 1, 1],
          [2, 2, 2, 2], [1, 3, 8, 8], [2, 4, 4, 4], [3, 3, 3, 3], [1, 1, 1, 64], [2, 1, 16, 16]]

FRESH_READ = """
import sys, time
from opdiff_snap.goldens import GoldenStore
store = GoldenStore(sys.argv[1])
t0 = time.perf_counter()
store.read(sys.argv[2], 0)
print((time.perf_counter() - t0) * 1000)
"""


def suite_text(n: int) -> str:
    lines = ["tests:"]
    count = 0
    for shape in SHAPES:
        for op in UNARY + BINARY + REDUCE:
            if count == n:
                return "\n".join(lines) + "\n"
            name = op.split(".")[0]
            t = f"{{type: tensor, shape: {shape}, dtype: float32, init: uniform, low: 0.1, high: 4.0}}"
            if op in UNARY:
                ins = f"[{t}]"
            elif op in BINARY:
                ins = f"[{t}, {t}]"
            else:
                ins = f"[{t}, {{type: int_list, elems: [{len(shape) - 1}]}}]"
            lines += [f"  - id: {name}__{'x'.join(map(str, shape))}", f"    op: aten::{op}", f"    in: {ins}"]
            count += 1
    if count == n:
        return "\n".join(lines) + "\n"
    raise SystemExit(f"--n {n} is more than the {count} tests this generator makes")


def timed_writes() -> list[float]:
    """Wrap GoldenStore.write and GoldenStore.info; returns the list the times go into."""
    spent = {"write": [], "info": []}
    for name in ("write", "info"):
        original = getattr(GoldenStore, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            out, seconds = timed(lambda: _original(self, *args, **kwargs))
            spent[_name].append(seconds)
            return out

        setattr(GoldenStore, name, functools.wraps(original)(wrapper))
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=520)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="use this project dir and keep it")
    a = ap.parse_args()
    project = a.keep or Path(tempfile.mkdtemp(prefix="bench_record_"))
    try:
        (project / "suites").mkdir(parents=True, exist_ok=True)
        (project / "suites" / "bench.yaml").write_text(suite_text(a.n))
        settings = Settings(suites=project / "suites", goldens=project / "goldens", store=project / "store",
                            jobs=a.jobs, repeats=a.repeats, warmup=0)
        spent = timed_writes()
        report = api.record(api.RecordRequest(), settings=settings)
        counts = report.counts()
        assert counts == {"RECORDED": a.n}, counts
        write_s, info_s = sum(spent["write"]), sum(spent["info"])
        infer = [r.infer_ms for r in report.results if r.infer_ms is not None]

        spent["info"].clear()
        again, kept_wall = timed(lambda: api.record(api.RecordRequest(), settings=settings))
        assert again.counts() == {"KEPT": a.n}, again.counts()

        some_id = report.results[len(report.results) // 2].test_id
        reads = []
        for _ in range(5):
            out = subprocess.run([sys.executable, "-c", FRESH_READ, str(settings.goldens), some_id],
                                 capture_output=True, text=True, check=True)
            reads.append(float(out.stdout.strip()))

        rows = [
            ("tests recorded", f"{a.n} (jobs={a.jobs}, repeats={a.repeats}, warmup=0)"),
            ("record wall", f"{report.wall_s:.2f} s"),
            ("per test", f"{report.wall_s / a.n * 1000:.1f} ms wall"),
            ("baseline infer (median)", f"{statistics.median(infer):.3f} ms"),
            ("GoldenStore.write total", f"{write_s:.3f} s = {write_s / report.wall_s:.1%} of wall (goal <= 5%)"),
            ("GoldenStore.write per golden", f"{write_s / a.n * 1000:.2f} ms"),
            ("store.info (plan) total", f"{info_s:.3f} s = {info_s / report.wall_s:.1%} of wall"),
            ("second record (all KEPT) wall", f"{kept_wall:.2f} s ({sum(spent['info']):.3f} s in store.info)"),
            ("read one golden, fresh process", f"median {statistics.median(reads):.2f} ms "
                                               f"(min {min(reads):.2f}, max {max(reads):.2f}; goal <= 10 ms)"),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
    finally:
        if a.keep is None:
            shutil.rmtree(project, ignore_errors=True)


if __name__ == "__main__":
    main()
