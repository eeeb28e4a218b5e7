"""Are two history run files' results the same apart from timings and ids?

    python tools/same_items.py A.jsonl B.jsonl

Used to show that a change of the tool changed no behaviour: every item of A has an item
of B with the same (test, seed, preset) and the same fields, and the other way round,
apart from what differs between runs by nature (opdiff_snap/history/item_diff.py: timings,
ids, pids, addresses, log lines and times, checkout and temporary paths, the runtime's own
output, cache hits, batch sizes, keys written as null). Prints the differences and a
summary line; exit 1 if any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opdiff_snap.history.item_diff import item_diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="a run file (runs/*.jsonl of a history store)")
    ap.add_argument("b", type=Path, help="the run file to compare it with")
    ap.add_argument("--most", type=int, default=50, help="print at most this many differences")
    args = ap.parse_args()
    diff = item_diff(args.a, args.b)
    print("\n".join(diff.lines(args.most)))
    return 0 if diff.same else 1


if __name__ == "__main__":
    sys.exit(main())
