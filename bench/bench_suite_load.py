"""Reading every shipped suite: discovery and expansion of suites/ (4,886 tests, 2 MB of
OpInfo YAML among them), cold (no suite cache) and warm (expansions kept in a cache
folder), each in a fresh interpreter with torch already imported.

    python bench/bench_suite_load.py [--runs 3] [--before REV]

`--before REV` times the package as it is at git revision REV too (extracted with
`git archive` into a temporary folder, put first on the path), on the same suites.
Prints JSON: the median seconds of each phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, package_env

CHILD = """
import json, sys, time
from pathlib import Path
import torch
from opdiff_snap.suite import load_suites, suite_paths
from opdiff_snap.suite.reader import SuiteReader

cache = Path(sys.argv[1]) if sys.argv[1] != "-" else None
reader = SuiteReader(cache)
t0 = time.perf_counter()
paths = suite_paths(None, Path("suites"), reader)
t1 = time.perf_counter()
cases = load_suites(paths, reader=reader)
t2 = time.perf_counter()
import opdiff_snap
assert opdiff_snap.__file__.startswith(sys.argv[2]), opdiff_snap.__file__
print(json.dumps({"tests": len(cases), "discover_s": t1 - t0, "load_s": t2 - t1, "total_s": t2 - t0}))
"""


def measure(package_root: Path, cache: str) -> dict:
    # -P: the package comes from `package_root` (PYTHONPATH), not from the folder the child runs in
    out = subprocess.run([sys.executable, "-P", "-c", CHILD, cache, str(package_root)], cwd=ROOT,
                         env=package_env(package_root),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def series(package_root: Path, runs: int) -> dict:
    cold = [measure(package_root, "-") for _ in range(runs)]
    with tempfile.TemporaryDirectory() as cache:
        measure(package_root, cache)                       # fills the cache
        warm = [measure(package_root, cache) for _ in range(runs)]
    return {"tests": cold[0]["tests"],
            **{f"cold_{k}": round(statistics.median(r[k] for r in cold), 2)
               for k in ("discover_s", "load_s", "total_s")},
            "warm_total_s": round(statistics.median(r["total_s"] for r in warm), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", help="a git revision to time as well")
    args = parser.parse_args()
    report = {"load_average": load(), "now": series(ROOT, args.runs)}
    if args.before:
        with tempfile.TemporaryDirectory() as tree:
            archive = subprocess.run(["git", "archive", args.before, "opdiff_snap"], cwd=ROOT, capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            report[f"at {args.before}"] = series(Path(tree), args.runs)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
