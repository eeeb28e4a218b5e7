"""Verdict quality: planted fp16 bugs caught, and no false alarms from the bounds.

Checks the shipped goldens (or the suites given) on clean presets and on the six planted-bug
fp16 presets of tests/helpers/numerics/planted.py, then reports:

- per clean preset, the MISMATCHes by the bound that failed; those of the elementwise and
  bias bounds are listed one by one (on a correct backend each is a false alarm unless
  torch eager at that precision shares it, `precision_limited`);
- per planted bug, the tests it reaches and how many of them are MISMATCH. A bug reaches
  a test when it adds more to the output's largest error than any correct float16 kernel
  may differ by anywhere in it: max_abs above torch_cpu_fp16's for the same test and seed
  by more than 2^-9 x max|expected| (the normwise cap for fp16) and more than the test's
  atol (a bug inside the test's own tolerance is one the suite accepts). Below that, a bug hides in
  rounding on some outputs; the bias bound catches it on many, counted apart ("below reach":
  the floating outputs of at least 16 elements it changed by more than the test's atol).

    PYTHONPATH=tests python bench/bench_verdicts.py -j 2 --clean torch_cpu_fp16,onnx_cpu_fp32 suites/*.yaml
    PYTHONPATH=tests python bench/bench_verdicts.py -j 2 --clean torch_cpu_fp16 --zoo   # the zoo's transformers

Results stay in the history store (--store, default a scratch folder) for queries.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from benchlib import ROOT, cli, needs_test_helpers, query

needs_test_helpers(__file__)
from helpers.check import make_site  # noqa: E402
from helpers.numerics.planted import ENTRY_POINTS, PRESETS  # noqa: E402

NEW_BOUNDS = ("elementwise", "bias")
CONTROL = "torch_cpu_fp16"
CAP = 2.0 ** -9


def opdiff(args: list[str], env: dict[str, str]) -> None:
    subprocess.run(cli(*args), cwd=ROOT, env=env, check=False, stdout=subprocess.DEVNULL)


def rows(store: Path, env: dict[str, str]) -> list[dict]:
    return query(store, "SELECT test_id, seed, preset, status, failed_bound, precision_limited, max_abs, "
                        "max_expected, bias, bias_bound, atol, drift, drift_bound, elementwise_ulps, numel, "
                        "error_message FROM results", env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suites", nargs="*", help="suite files (default: suites/*.yaml)")
    ap.add_argument("--clean", default="torch_cpu_fp16", help="comma-separated correct presets to check")
    ap.add_argument("--zoo", action="store_true", help="the model zoo's transformers (suites/zoo/text.yaml)")
    ap.add_argument("--no-planted", action="store_true", help="clean presets only")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--store", type=Path, default=None, help="history store (default: a scratch folder, kept)")
    ap.add_argument("--no-run", action="store_true", help="only report on the results already in --store")
    args = ap.parse_args()

    suites = args.suites or ([str(ROOT / "suites" / "zoo" / "text.yaml")] if args.zoo
                             else sorted(str(p) for p in (ROOT / "suites").glob("*.yaml")))
    scratch = Path(tempfile.mkdtemp(prefix="opdiff-verdicts-"))
    store = args.store or scratch / "store"
    site = make_site(scratch / "site", ENTRY_POINTS, "opdiff-planted-bench")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT / "tests"),
                                                         os.environ.get("PYTHONPATH", "")])}
    clean = [p for p in args.clean.split(",") if p]
    presets = clean + ([] if args.no_planted else [CONTROL, *PRESETS])
    flags = [x for p in dict.fromkeys(presets) for x in ("-b", p)]
    if not args.no_run:
        opdiff(["--store", str(store), "check", *flags, "-j", str(args.jobs), *suites], env)
    results = rows(store, env)

    by_key = {(r["test_id"], r["seed"], r["preset"]): r for r in results}
    print(f"{len(results)} results in {store}\n")
    print("clean presets: MISMATCH by failed bound; the new bounds' MISMATCHes listed")
    for preset in clean:
        mine = [r for r in results if r["preset"] == preset]
        counts: dict[str, int] = defaultdict(int)
        for r in mine:
            counts[r["status"] if r["status"] != "MISMATCH" else f"MISMATCH/{r['failed_bound']}"] += 1
        print(f"  {preset}: {len(mine)} results: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for r in mine:
            if r["status"] == "MISMATCH" and r["failed_bound"] in NEW_BOUNDS:
                print(f"    {r['test_id']} s{r['seed']}: {r['failed_bound']}, precision-limited "
                      f"{r['precision_limited']}, ulps {r['elementwise_ulps']}, bias {r['bias']} / {r['bias_bound']}, "
                      f"drift {r['drift']} / {r['drift_bound']}")
    if args.no_planted:
        return
    print("\nplanted bugs: tests reached, caught (MISMATCH among them), missed; below reach: changed, caught")
    for preset in PRESETS:
        reached, caught, missed, below, below_caught = 0, 0, [], 0, 0
        for r in results:
            control = by_key.get((r["test_id"], r["seed"], CONTROL))
            if r["preset"] != preset or control is None or control["status"] not in ("PASS", "MISMATCH") \
                    or r["max_abs"] is None or control["max_abs"] is None:
                continue
            extra = r["max_abs"] - control["max_abs"]
            if extra > max(CAP * (r["max_expected"] or 0.0), r["atol"] or 0.0):
                reached += 1
                if r["status"] != "PASS":
                    caught += 1
                else:
                    missed.append(f"{r['test_id']} s{r['seed']} (max_abs {r['max_abs']:.3g} vs torch fp16 "
                                  f"{control['max_abs']:.3g}, max|expected| {r['max_expected']:.3g}, bias "
                                  f"{r['bias']}/{r['bias_bound']}, drift {r['drift']}/{r['drift_bound']})")
            elif extra > (r["atol"] or 0.0) and r["bias"] is not None:
                below += 1
                below_caught += r["status"] != "PASS"
        print(f"  {preset}: reached {reached}, caught {caught}, missed {len(missed)}; "
              f"below reach: changed {below}, caught {below_caught}")
        for m in missed[:20]:
            print(f"    missed: {m}")

if __name__ == "__main__":
    main()
