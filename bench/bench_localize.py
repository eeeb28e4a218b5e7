"""What localize costs: wall time and pieces run, on the shipped goldens.

    python bench/bench_localize.py                      # the default cases below, -j 2
    python bench/bench_localize.py --case 'mixer_block:torch_cpu_fp16:ops' -j 2 --report

A case is TEST:PRESET[:ops][:bf0] (`ops`: --ops; `bf0`: --baseline-factor 0). Run from
the repository root (it reads ./goldens). Prints one markdown row per case: wall time,
the submodule calls and ATen nodes run alone, and what was found.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchlib import load, timed

from opdiff_snap import api
from opdiff_snap.cause.localize_report import format_report
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite.model import Tolerance

CASES = ("tiny_attention_decoder__n_layers=1:executorch_cpu_fp16:bf0",
         "mixer_block:torch_cpu_fp16:ops",
         "transformer_block__d_ff=FF__d_model=D__n_heads=HEADS:torch_cpu_bf16:ops")


def run(case: str, jobs: int, show: bool = False) -> str:
    test_id, preset, *flags = case.split(":")
    tol = Tolerance(baseline_factor=0.0) if "bf0" in flags else None
    report, wall = timed(lambda: api.localize(test_id, preset, ops="ops" in flags, tolerance=tol,
                                              goldens=Path("goldens"), settings=Settings(jobs=jobs, timeout_s=600)))
    if show:
        print(format_report(report), file=sys.stderr, flush=True)
    subs = len(report.rows) + len(report.enclosing)
    ops = report.ops
    nodes = sum(r.status is not Verdict.SKIPPED for r in ops.rows) if ops else 0
    if ops is not None and ops.finding is not None:
        f = ops.finding
        found = f"{f.status} at {f.label} of '{ops.scope or '<root>'}' ({ops.node_count} nodes)"
    elif report.first_divergent is not None:
        found = f"submodule '{report.first_divergent.label}' {report.first_divergent.status}"
    else:
        found = "nothing diverges"
    return f"| `{test_id}` | {preset} | {' '.join(flags) or '-'} | {wall:.1f} s | {subs} | {nodes} | {found} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="TEST:PRESET[:ops][:bf0]; repeatable")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="also print each full report (stderr)")
    args = parser.parse_args()
    print(f"load average before: {load():.2f}")
    print("| test | preset | flags | wall | submodule calls run | ATen nodes run | found |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in args.case or CASES:
        print(run(case, args.jobs, args.report), flush=True)
    print(f"load average after: {load():.2f}")


if __name__ == "__main__":
    main()
