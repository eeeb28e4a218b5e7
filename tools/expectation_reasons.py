"""Fill the empty reasons of expectations.yaml from docs/results-notes.yaml, the rules that
explain every non-PASS of docs/results.md, matched against the results of check runs.

    for p in onnx_cpu_fp16 executorch_cpu_fp32; do
        opdiff --store /tmp/s check -b $p suites/*.yaml --update-expectations
    done
    python tools/expectation_reasons.py /tmp/s/runs/*.jsonl

A reason already written is kept (--refresh: unless a rule wrote it, for after the rules
changed); an entry no rule explains is listed, to be written by
hand (with --untriaged it gets "not triaged yet: " and the head of its message meanwhile;
such a reason is replaced once a rule explains the entry).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opdiff_snap.analytics.shipped_results import fill_reasons_from_runs
from opdiff_snap.core.errors import OpdiffError

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run files whose results the entries describe")
    ap.add_argument("--expectations", type=Path, default=ROOT / "expectations.yaml")
    ap.add_argument("--notes", type=Path, default=ROOT / "docs" / "results-notes.yaml")
    ap.add_argument("--refresh", action="store_true",
                    help="derive again the reasons a rule wrote (they open with a kind: 'backend limit: ...') "
                         "of the entries the runs name, after the rules changed; reasons written by hand are kept")
    ap.add_argument("--untriaged", action="store_true",
                    help="give an entry no rule explains the reason 'not triaged yet: <its message's first words>'")
    args = ap.parse_args()
    try:
        fill_reasons_from_runs(args.expectations, args.notes, args.runs, args.refresh, args.untriaged)
    except OpdiffError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
