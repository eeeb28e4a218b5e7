"""Benchmark the golden store on N small op tests (default 500).

    python bench/bench_store.py [--n 500] [--root DIR] [--keep]

A record-like loop: per test, materialise 2-3 seeded float32 inputs of ~1k elements and
apply one torch op (timed as "baseline"), then write the golden (timed as "store").
Then: index(), reading every golden, verify(), and reading one golden in a fresh process
after its imports. Prints one table.
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

import torch
from benchlib import timed

from opdiff_snap.goldens import Golden, GoldenStore
from opdiff_snap.suite.model import Invocation

OPS = [  # (name, number of inputs, fn)
    ("add", 2, torch.add), ("mul", 2, torch.mul), ("sub", 2, torch.sub),
    ("addcmul", 3, torch.addcmul), ("where_gt", 3, lambda a, b, c: torch.where(a > 0, b, c)),
    ("sigmoid", 2, lambda a, b: torch.sigmoid(a) * b), ("matmul", 2, lambda a, b: a @ b),
    ("softmax", 2, lambda a, b: torch.softmax(a + b, dim=-1)),
]

FRESH_READ = """
import sys, time
from pathlib import Path
t0 = time.perf_counter()
from opdiff_snap.goldens import GoldenStore
t1 = time.perf_counter()
g = GoldenStore(Path(sys.argv[1])).read(sys.argv[2], 0)
t2 = time.perf_counter()
g2 = GoldenStore(Path(sys.argv[1])).read(sys.argv[3], 0)
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def materialise(i: int) -> tuple[str, list[torch.Tensor], object]:
    name, n_in, fn = OPS[i % len(OPS)]
    gen = torch.Generator().manual_seed(i)
    shape = (32, 32)  # 1,024 elements
    inputs = [torch.randn(shape, generator=gen) for _ in range(n_in)]
    return name, inputs, fn


def made(i: int) -> tuple[str, list[torch.Tensor], torch.Tensor]:
    """Test `i`'s name, inputs and the output of its op (the baseline's part of a record)."""
    name, inputs, fn = materialise(i)
    return name, inputs, fn(*inputs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--root", type=Path, default=None, help="store directory (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the store afterwards")
    opts = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_goldens_"))
    root = opts.root or tmp / "goldens"
    if root.exists():
        shutil.rmtree(root)
    store = GoldenStore(root)

    baseline_s = store_s = 0.0
    per_write = []
    ids = []
    for i in range(opts.n):
        (name, inputs, out), made_s = timed(lambda i=i: made(i))
        test_id = f"aten::{name}/case_{i:04d}"
        golden = Golden(
            test_id=test_id, seed=0, spec_hash=f"{i:064x}", suite="suites/bench.yaml",
            definition={"op": name, "inputs": [{"randn": [32, 32]}] * len(inputs)}, test_type="op",
            baseline={"name": "torch_cpu_fp32", "family": "torch", "device": "cpu", "precision": "fp32",
                      "options": {}},
            env={"torch": torch.__version__}, created="2026-01-01T00:00:00Z",
            invocation=Invocation(args=inputs, kwargs={}), outputs=(out,))
        _, write_s = timed(functools.partial(store.write, golden))
        baseline_s += made_s
        store_s += write_s
        per_write.append(write_s)
        ids.append(test_id)

    infos, index_s = timed(store.index)
    assert len(infos) == opts.n
    _, read_all_s = timed(lambda: [store.read(test_id, 0) for test_id in ids])
    problems, verify_s = timed(store.verify)
    assert not problems, problems[:3]

    fresh = []
    for k in range(5):
        out = subprocess.run([sys.executable, "-c", FRESH_READ, str(root), ids[(k * 97) % opts.n],
                              ids[(k * 97 + 1) % opts.n]], capture_output=True, text=True, check=True)
        fresh.append([float(v) for v in out.stdout.split()])

    n = opts.n
    rows = [
        ("tests", f"{n}", ""),
        ("baseline: materialise + op (total)", f"{baseline_s * 1e3:.1f} ms", f"{baseline_s / n * 1e3:.3f} ms/test"),
        ("store: write (total)", f"{store_s * 1e3:.1f} ms", f"{store_s / n * 1e3:.3f} ms/test, "
                                                            f"median {statistics.median(per_write) * 1e3:.3f}"),
        ("store share of record loop", f"{store_s / (store_s + baseline_s) * 100:.1f} %",
         "store / (store + baseline)"),
        ("index()", f"{index_s * 1e3:.1f} ms", f"{index_s / n * 1e6:.0f} us/golden"),
        ("read all", f"{read_all_s * 1e3:.1f} ms", f"{read_all_s / n * 1e3:.3f} ms/golden"),
        ("verify()", f"{verify_s * 1e3:.1f} ms", ""),
        ("fresh process: import opdiff_snap.goldens", f"{statistics.median(f[0] for f in fresh) * 1e3:.0f} ms",
         "median of 5 (torch import included)"),
        ("fresh process: read one golden (first read)", f"{statistics.median(f[1] for f in fresh) * 1e3:.2f} ms",
         f"max {max(f[1] for f in fresh) * 1e3:.2f} ms; goal <= 10 ms"),
        ("fresh process: read a second golden", f"{statistics.median(f[2] for f in fresh) * 1e3:.2f} ms", ""),
        ("files in store", f"{sum(1 for p in root.rglob('*') if p.is_file())}", ""),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"golden store benchmark (torch {torch.__version__}, {root})")
    for a, b, c in rows:
        print(f"  {a:<{w0}}  {b:>{w1}}  {c}")
    if not opts.keep and opts.root is None:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
