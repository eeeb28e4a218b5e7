"""Rewrite tests/durations.json, the seconds each test file took, from the output of a
pytest run with `--durations=0`; tests/conftest.py hands the files to xdist's workers
longest first with it.

    python -m pytest -n auto --dist loadfile --durations=0 > /tmp/t.log
    python tools/test_durations.py /tmp/t.log
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(tests/[^:\s]+\.py)::")


def per_file(log: str) -> Counter:
    seconds: Counter = Counter()
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path, help="output of a pytest run with --durations=0")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "durations.json")
    args = ap.parse_args()
    seconds = per_file(args.log.read_text())
    if not seconds:
        raise SystemExit(f"{args.log}: no durations in it; run pytest with --durations=0")
    ordered = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}
    args.out.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{args.out}: {len(ordered)} files, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main()
