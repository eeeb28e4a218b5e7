"""Comparison speed: `compare` on float32, bfloat16 and int64 tensors of 1k and 1M elements.

    python bench/bench_compare.py
"""

from __future__ import annotations

import torch
from benchlib import walls

from opdiff_snap.compare.numerics import compare
from opdiff_snap.suite.model import Tolerance


def main() -> None:
    g = torch.Generator().manual_seed(0)
    tol = Tolerance(1e-5, 1.3e-6)
    for numel in (1_000, 1_000_000):
        e = torch.randn(numel, generator=g)
        cases = {"float32": (e, e + 1e-7), "bfloat16": (e.bfloat16(), e.bfloat16()),
                 "int64": ((e * 100).long(), (e * 100).long())}
        for name, (a, b) in cases.items():
            ms = min(walls(lambda a=a, b=b: compare(a, b, tol), 7)) * 1e3
            print(f"{name:9} {numel:>9,} elements: {ms:8.3f} ms")


if __name__ == "__main__":
    main()
