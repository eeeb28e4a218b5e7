"""Are two runs' results the same apart from timings and ids?

    python tools/compare_runs.py A.jsonl B.jsonl

Used to show that a refactor changed no behaviour: every item of A has an item of B with
the same (test, seed, preset), status, message, tolerance and metrics, and the other way
round. Timings, run ids, timestamps, cache hits, worker pids and temporary paths in
messages are left out of the comparison. Prints the differences; exit 1 if any.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

IGNORED = {"run_id", "ts", "export_ms", "load_ms", "infer_ms", "infer_ms_all", "cache_hit", "times_all",
           "backends", "type"}
_VOLATILE = [(re.compile(r"pid \d+"), "pid N"), (re.compile(r"/tmp/[^\s'\"]+"), "/tmp/..."),
             (re.compile(r"0x[0-9a-f]{6,}"), "0x...")]


def items(path: Path) -> dict[tuple, dict]:
    out = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        if row.get("type") != "item":
            continue
        key = (row["id"], row["seed"], row["preset"])
        kept = {k: v for k, v in row.items() if k not in IGNORED}
        if isinstance(kept.get("error_message"), str):
            for pattern, repl in _VOLATILE:
                kept["error_message"] = pattern.sub(repl, kept["error_message"])
        out[key] = kept
    return out


def main() -> int:
    a, b = items(Path(sys.argv[1])), items(Path(sys.argv[2]))
    problems = [f"only in A: {k}" for k in sorted(a.keys() - b.keys())]
    problems += [f"only in B: {k}" for k in sorted(b.keys() - a.keys())]
    for key in sorted(a.keys() & b.keys()):
        for field in sorted(set(a[key]) | set(b[key])):
            if a[key].get(field) != b[key].get(field):
                problems.append(f"{key} {field}: {a[key].get(field)!r} != {b[key].get(field)!r}")
    for p in problems[:50]:
        print(p)
    print(f"{len(a)} items in A, {len(b)} in B, {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
