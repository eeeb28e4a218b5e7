"""Benchmark `opdiff regressions` (analytics/steps.py) on synthetic histories with planted changes.

    PYTHONPATH=tests python bench/bench_regressions.py [--runs 1000] [--tests 250] [--envs 10]
        [--seeds 3] [--dir D] [--keep] [--skip-scale]

With --dir D --keep the 1M-result history stays in D/scale and a later run with --dir D reuses it.

1. Precision and recall: for each of --seeds small histories (120 runs x 100 tests x 4 presets,
   12 environments, tests/helpers/history/planted.py), a finding is a hit when it names the planted
   (test, preset, kind) at the planted run.
2. Scale: one history of --runs runs x --tests tests x 4 presets (default 1M results);
   generation and the cache build are timed apart, then the detection itself with the cache.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from benchlib import needs_test_helpers, timed

from opdiff_snap.analytics import connect
from opdiff_snap.analytics.steps import detect

needs_test_helpers(__file__)
from helpers.history.planted import TRUTH, generate, read_truth  # noqa: E402


def score(planted, found) -> tuple[int, int, int]:
    """(hits, planted, found), each counted by (test, preset, kind, run)."""
    truth = {(p.test_id, p.preset, p.kind, p.run_id) for p in planted}
    got = {(f.test_id, f.preset, f.kind, f.run_id) for f in found}
    return len(truth & got), len(truth), len(got)


def accuracy(root: Path, seeds: int) -> None:
    hits = planted = found = 0
    for seed in range(seeds):
        store = root / f"acc{seed}"
        h = generate(store, runs=120, tests=100, envs=12, seed=seed)
        with connect(store, warn=False) as a:
            fs = detect(a)
        n = score(h.planted, fs)
        print(f"seed {seed}: {n[1]} planted, {n[2]} found, {n[0]} hits")
        hits, planted, found = hits + n[0], planted + n[1], found + n[2]
    print(f"precision {hits / max(found, 1):.3f}  recall {hits / max(planted, 1):.3f}  "
          f"({hits} hits, {planted} planted, {found} found)")


def scale(root: Path, runs: int, tests: int, envs: int) -> None:
    store = root / "scale"
    if (store / TRUTH).is_file():     # --dir of an earlier --keep: the history and its cache are there
        planted = read_truth(store)
        print(f"reusing {store}")
    else:
        h, seconds = timed(lambda: generate(store, runs=runs, tests=tests, envs=envs, seed=100))
        planted = h.planted
        print(f"generate {runs} runs x {h.results} results: {seconds:.1f} s")
    _, seconds = timed(lambda: connect(store, warn=False).close())
    print(f"cache build or update (first connect): {seconds:.1f} s")
    for attempt in range(3):
        t0 = time.perf_counter()
        with connect(store, warn=False) as a:
            t1, cpu = time.perf_counter(), time.process_time()
            fs = detect(a)
            t2, cpu = time.perf_counter(), time.process_time() - cpu
        n = score(planted, fs)
        print(f"detect #{attempt + 1}: {t2 - t1:.2f} s wall, {cpu:.2f} s CPU (connect {t1 - t0:.2f} s); "
              f"{len(fs)} findings, precision {n[0] / max(n[2], 1):.3f}, recall {n[0] / max(n[1], 1):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--tests", type=int, default=250)
    ap.add_argument("--envs", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-regressions-"))
    try:
        accuracy(root, args.seeds)
        if not args.skip_scale:
            scale(root, args.runs, args.tests, args.envs)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
