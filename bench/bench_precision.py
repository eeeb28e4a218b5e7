"""Composite tests on fp16/bf16 judged against torch's own precision: verdicts before and
after, and the multiples of torch eager's own error that correct backends reach.

For each preset, one check of the suites with the allowance off (`--precision-factor 0`,
the rule as it was) and one with it on (the default, or --factor), sharing the artifact
cache; then, from the history:

- per preset and rule, the counts by verdict;
- per preset, the composite outputs' `torch_multiple` (the backend's error against the
  float64 reference over torch eager's own at that precision, the worse of RMS and
  largest error): its largest value and the tests above 1.5x, with their verdicts.

    python bench/bench_precision.py -j 2                       # zoo + models, 4 presets
    python bench/bench_precision.py --suites 'suites/*.yaml' --presets onnx_cpu_fp16

Prints JSON; the history stays in --store (default a scratch folder) for queries.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchlib import ROOT, check_once, query

PRESETS = "torch_cpu_fp16,torch_cpu_bf16,onnx_cpu_fp16,executorch_cpu_fp16"


def check(store: Path, cache: Path, suites: list[str], preset: str, factor: str, jobs: int) -> dict:
    return check_once(store, cache, suites, preset, jobs, *(["--precision-factor", factor] if factor else []))


def rows_of(store: Path, run: str) -> list[dict]:
    return query(store, "SELECT test_id, status, torch_multiple, torch_factor, as_torch, precision_limited, "
                        f"max_abs, failed_bound FROM results WHERE run_id = '{run}' ORDER BY test_id")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=PRESETS)
    ap.add_argument("--suites", action="append", help="globs under the repository root "
                    "(default: suites/zoo and suites/models.yaml)")
    ap.add_argument("--factor", default="", help="the allowance's multiple for the 'after' run (default: "
                    "the precision's own)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--store", type=Path)
    args = ap.parse_args()
    suites = sorted(p for g in (args.suites or ["suites/zoo", "suites/models.yaml"])
                    for p in glob.glob(g, root_dir=ROOT))
    base = args.store or Path(tempfile.mkdtemp(prefix="opdiff-bench-precision-"))
    store, cache = base / "store", base / "cache"
    out: dict = {"suites": suites, "presets": {}}
    for preset in [p for p in args.presets.split(",") if p]:
        entry: dict = {}
        for name, factor in (("before", "0"), ("after", args.factor)):
            run = check(store, cache, suites, preset, factor, args.jobs)
            rows = rows_of(store, run["run"])
            run["counts"] = dict(Counter(r["status"] for r in rows))
            entry[name] = run
            if name == "after":
                measured = [r for r in rows if r["torch_multiple"] is not None]
                entry["multiples"] = {
                    "outputs_judged": len(measured),
                    "largest": max((r["torch_multiple"] for r in measured), default=None),
                    "above_1.5": [{k: r[k] for k in ("test_id", "status", "torch_multiple", "as_torch",
                                                     "precision_limited", "failed_bound")}
                                  for r in measured if r["torch_multiple"] > 1.5],
                    "passed_as_torch": [r["test_id"] for r in rows if r["as_torch"]],
                }
        out["presets"][preset] = entry
        print(json.dumps({preset: entry}), file=sys.stderr, flush=True)
    out["store"] = str(base)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
