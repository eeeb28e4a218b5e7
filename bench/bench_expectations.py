"""Judging results against the shipped expectations file: every shipped test id on each
preset the file names, looked up as a check looks up its results, against a scan of every
entry for each result (what the lookup did before it was indexed by test id).

    python bench/bench_expectations.py [--scan-sample 2000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from opdiff_snap import api

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scan-sample", type=int, default=2000,
                        help="results judged by scanning every entry (the whole run would take minutes)")
    args = parser.parse_args()
    expectations = api.load_expectations(ROOT / "expectations.yaml")
    ids = [c.id for c in api.list_tests(settings=api.Settings(suites=ROOT / "suites"))]
    presets = sorted({e.preset for e in expectations.entries})
    lookups = [(p, i) for p in presets for i in ids]

    t0 = time.perf_counter()
    found = sum(expectations.match(p, i, 0) is not None for p, i in lookups)
    indexed = time.perf_counter() - t0

    sample = lookups[:: max(1, len(lookups) // args.scan_sample)]
    t0 = time.perf_counter()
    for p, i in sample:
        named = [e for e in expectations.entries if e.names(p, i, 0)]
        max(named, key=lambda e: e.specificity(p, i)) if named else None
    scanned = time.perf_counter() - t0

    per_indexed = indexed / len(lookups) * 1e6
    per_scanned = scanned / len(sample) * 1e6
    print(f"{len(expectations)} entries, {len(ids)} shipped tests, {len(presets)} presets: "
          f"{len(lookups)} lookups, {found} expected")
    print(f"indexed by test id: {indexed:.2f} s ({per_indexed:.1f} us per result)")
    print(f"scan of every entry: {per_scanned:.0f} us per result ({len(sample)} results), "
          f"{per_scanned / per_indexed:.0f}x; for one preset's {len(ids)} results "
          f"{per_scanned * len(ids) / 1e6:.1f} s each time a run judges them")


if __name__ == "__main__":
    main()
