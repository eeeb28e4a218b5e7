"""What a reading command costs before it reads anything: `opdiff --help` and `opdiff runs`
on an empty store, each a fresh interpreter, against `python -c "import torch"`.

    python bench/bench_cli_start.py [--repeats 7]

Prints the median wall of each (seconds) and the 1-minute load average, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import load, walls

OPDIFF = str(Path(sys.executable).with_name("opdiff"))


def wall(argv: list[str], cwd: str, repeats: int) -> float:
    return statistics.median(walls(lambda: subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                                                          stderr=subprocess.DEVNULL), repeats))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = load()
        out = {
            "opdiff --help": wall([OPDIFF, "--help"], tmp, args.repeats),
            "opdiff runs (empty store)": wall([OPDIFF, "runs"], tmp, args.repeats),
            "python -c 'import torch'": wall([sys.executable, "-c", "import torch"], tmp, args.repeats),
            "load_1min": before,
        }
    print(json.dumps({k: round(v, 3) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
