"""What the float64 reference costs at record time, on the shipped suites.

    python bench/bench_reference.py [--rounds 3] [-j 2]

Records suites/ into fresh golden stores with and without the reference (alternating,
`--rounds` times each), then prints the median record wall time and the store's bytes
on disk for each, and the ratios (goals: at most 1.5x the time, 2x the bytes).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, timed

from opdiff_snap import api
from opdiff_snap.core.config import Settings


def store_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    walls: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, int] = {}
    print(f"load average before: {load():.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench-reference-") as tmp:
        for i in range(args.rounds):
            for reference in (True, False):
                root = Path(tmp) / f"{reference}-{i}"
                settings = Settings(suites=ROOT / "suites", goldens=root / "goldens", store=root / "store",
                                    jobs=args.jobs, repeats=1, warmup=0)
                with contextlib.chdir(ROOT):
                    report, wall = timed(functools.partial(api.record, api.RecordRequest(reference=reference),
                                                                       settings=settings))
                walls[reference].append(wall)
                sizes[reference] = store_bytes(root / "goldens")
                print(f"round {i} reference={reference}: {walls[reference][-1]:.1f} s, {report.counts()}, "
                      f"{sizes[reference]:,} bytes", flush=True)
                shutil.rmtree(root)
    on, off = statistics.median(walls[True]), statistics.median(walls[False])
    print(f"record wall (median of {args.rounds}): with reference {on:.1f} s, without {off:.1f} s, "
          f"ratio {on / off:.2f} (goal <= 1.5)")
    print(f"store bytes: with reference {sizes[True]:,}, without {sizes[False]:,}, "
          f"ratio {sizes[True] / sizes[False]:.2f} (goal <= 2)")
    print(f"load average after: {load():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
