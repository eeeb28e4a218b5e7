"""`opdiff upgrade` twice with the same requirements: the first builds the environment and
exports in both environments, the second reuses the environment, the artifact cache and
the fresh check of this environment.

    python bench/bench_upgrade.py [--with onnxruntime==1.30.0] [-b onnx_cpu_fp32] [--test-ids 'a*;b']
                                  [--suites 'suites/*.yaml']
                                  [--work DIR]   # keep the store and cache there (default: a temp dir)

Runs the real CLI on the shipped suites and goldens of this checkout (or the tests named)
and reports, per run: wall, the environment's build or reuse time, the checks' walls, cache
hits, and whether the check here was run or reused. Prints the load average before each run.
"""

from __future__ import annotations

import argparse
import glob
import re
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, package_env, run_timed

from opdiff_snap.history.runs import read_run


def runs(store: Path) -> list[dict]:
    out = []
    for path in sorted((store / "runs").glob("*.jsonl")):
        run = read_run(path)
        out.append({"run": run.meta["run_id"], "onnxruntime": run.meta["env"].get("onnxruntime"),
                    "wall_s": run.end.get("wall_s"), "items": len(run.items),
                    "cache_hits": sum(bool(i.get("cache_hit")) for i in run.items)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--with", dest="withs", action="append", default=None)
    ap.add_argument("-b", "--backend", dest="backends", action="append", default=None)
    ap.add_argument("--test-ids", default=None)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--suites", default="", help="a glob under the repository root (default: every shipped suite)")
    args = ap.parse_args()
    withs = args.withs or ["onnxruntime==1.30.0"]
    backends = args.backends or ["onnx_cpu_fp32"]
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-upgrade-"))
    store, cache = work / "store", work / "cache"
    cmd = [sys.executable, "-m", "opdiff_snap.cli", "--store", str(store), "--cache", str(cache), "upgrade",
           *(x for w in withs for x in ("--with", w)), *(x for b in backends for x in ("-b", b))]
    if args.test_ids:
        cmd += ["--test-ids", args.test_ids]
    if args.suites:
        cmd += sorted(glob.glob(args.suites, root_dir=ROOT))
    env = package_env(ROOT)
    for n in (1, 2):
        before = {r["run"] for r in runs(store)} if store.exists() else set()
        print(f"upgrade #{n}: load {load():.2f} before", flush=True)
        wall, proc = run_timed(cmd, cwd=ROOT, env=env)
        (work / f"upgrade{n}.log").write_text(proc.stdout + proc.stderr)
        built = re.search(r"environment \S+ \((reused|built with \w+) in ([\d.]+) s\)", proc.stdout)
        new = [r for r in runs(store) if r["run"] not in before]
        print(f"upgrade #{n}: exit {proc.returncode}, wall {wall:.1f} s, environment "
              f"{built.group(1) if built else '?'} in {built.group(2) if built else '?'} s, load {load():.2f} after")
        for r in new:
            print(f"  check {r['run']} onnxruntime {r['onnxruntime']}: {r['items']} results, "
                  f"{r['wall_s']:.1f} s, {r['cache_hits']} cache hits")
        if "reusing run" in proc.stdout:
            print("  check here: reused " + re.search(r"reusing run (\S+)", proc.stdout).group(1))
        summary = [ln for ln in proc.stdout.splitlines() if "newly failing," in ln]
        print("  " + (summary[-1] if summary else proc.stderr.strip()[-500:]))
    print(f"store and cache in {work}")


if __name__ == "__main__":
    main()
