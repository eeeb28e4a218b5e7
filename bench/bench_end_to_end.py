"""End-to-end benchmark: record + check of a demo-sized suite through opdiff-snap, side by
side with the plain pattern a peer uses (one freshly spawned process per test x backend).

    python bench/bench_end_to_end.py [--n 40] [--backends torch_cpu_fp32,onnx_cpu_fp32] [-j 2]
    python bench/bench_end_to_end.py --shipped -b onnx_cpu_fp32   # overhead on all shipped suites

Reports:
- record wall, cold check wall (empty artifact cache), warm re-check wall (cache filled);
- the peer pattern's wall for the same check jobs (each job: spawn python, import torch
  and the backend, read the golden, export, load, run, compare -- our own runner, so the
  per-job work is identical and only the process model differs);
- framework overhead of the cold check = 1 - (backend export + load + inference time of
  all jobs) / (wall x workers): everything that is not the backends' own work.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, timed

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.suite import load_suites, suite_paths

PEER_JOB = r"""
import sys, pickle, time
from pathlib import Path
from opdiff_snap.goldens import GoldenStore
from opdiff_snap.backends.registry import get_preset
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.execution.runner import Job, run_job
from opdiff_snap.compare.numerics import compare
from opdiff_snap.compare.tolerance import tolerance_for
from opdiff_snap.suite import load_suites
suite, test_id, seed, preset_name, goldens = sys.argv[1:6]
case = next(c for c in load_suites([Path(suite)]) if c.id == test_id)
golden = GoldenStore(Path(goldens)).read(test_id, int(seed))
preset = get_preset(preset_name)
out = run_job(Job(case=case, seed=int(seed), invocation=golden.invocation, preset=preset,
                  repeats=5, warmup=1, cache_dir=None, key="peer"))
if out.status is None:
    actual = restore_outputs(out.output_structure, out.outputs)
    verdict = compare(golden.outputs, actual, tolerance_for(case.tolerance, preset)).verdict
else:
    verdict = out.status
print(verdict)
"""


def backend_ms(report) -> float:
    """Export + load + every timed and warm-up inference call of every result."""
    total = 0.0
    for r in report.results:
        total += (r.export_ms or 0.0) if not r.cache_hit else 0.0
        total += r.load_ms or 0.0
        calls = list(r.infer_ms_all)
        total += sum(calls) + (r.infer_ms or 0.0)  # one warm-up call at about the median
    return total


def peer(suite: Path, jobs: list[tuple[str, int, str]], goldens: Path, workers: int) -> None:
    """The peer pattern: one fresh process per job, at most `workers` at once (as ours)."""
    procs: list[subprocess.Popen] = []
    pending = list(jobs)
    while pending or procs:
        while pending and len(procs) < workers:
            test_id, seed, preset = pending.pop(0)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", PEER_JOB, str(suite), test_id, str(seed), preset, str(goldens)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs[0].wait()
        procs = [p for p in procs if p.poll() is None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40, help="tests from the shipped core_aten suite")
    ap.add_argument("-b", "--backends", default="torch_cpu_fp32,onnx_cpu_fp32")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--shipped", action="store_true", help="check every shipped suite (no peer run)")
    ap.add_argument("--skip-peer", action="store_true")
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b]

    work = Path(tempfile.mkdtemp(prefix="opdiff-bench-e2e-"))
    try:
        (work / "suites").mkdir()
        if args.shipped:
            shutil.copytree(ROOT / "suites", work / "suites", dirs_exist_ok=True)
            ids = None
        else:
            shutil.copy(ROOT / "suites" / "core_aten.yaml", work / "suites" / "core_aten.yaml")
            cases = load_suites(suite_paths(None, work / "suites"))
            ids = [";".join(c.id for c in cases[: args.n])]
        settings = Settings(suites=work / "suites", goldens=work / "goldens", store=work / "store",
                            cache=work / "cache", jobs=args.jobs, repeats=5, warmup=1)
        os.chdir(work)

        sel = api.Selection(suites=None, test_ids=ids)
        rec, record_wall = timed(lambda: api.record(api.RecordRequest(selection=sel, baseline="torch_cpu_fp32"),
                                                    settings=settings))
        n_tests = sum(1 for r in rec.results)

        cold, cold_wall = timed(lambda: api.check(api.CheckRequest(backends=backends, selection=sel),
                                                  settings=settings))
        warm, warm_wall = timed(lambda: api.check(api.CheckRequest(backends=backends, selection=sel),
                                                  settings=settings))

        peer_wall = None
        if not args.shipped and not args.skip_peer:
            suite = work / "suites" / "core_aten.yaml"
            jobs = [(r.test_id, r.seed, r.preset) for r in cold.results if r.case is not None]
            _, peer_wall = timed(lambda: peer(suite, jobs, settings.goldens, args.jobs))

        own = backend_ms(cold) / 1000
        overhead = 1 - own / (cold_wall * args.jobs)
        warm_hits = sum(r.cache_hit for r in warm.results)
        print(f"tests: {n_tests}  backends: {', '.join(backends)}  workers: {args.jobs}  "
              f"check results: {len(cold.results)}")
        print(f"record wall                {record_wall:8.2f} s   {rec.counts()}")
        print(f"check, cold cache          {cold_wall:8.2f} s   {cold.counts()}")
        print(f"check, warm cache          {warm_wall:8.2f} s   cache hits {warm_hits}")
        if peer_wall is not None:
            print(f"peer pattern (spawn/job)   {peer_wall:8.2f} s")
        print(f"backends' own time         {own:8.2f} s   (export + load + inference, summed over jobs)")
        print()
        print(f"warm re-check / cold        {warm_wall / cold_wall:6.3f}   (goal <= 0.1)")
        if peer_wall is not None:
            print(f"isolated check / peer       {cold_wall / peer_wall:6.3f}   (lower is better)")
        print(f"framework overhead          {overhead:6.1%}   of cold-check wall x workers (goal <= 10%)")
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
