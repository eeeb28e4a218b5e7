"""What a reading command costs before it reads anything: `opdiff --help` and `opdiff runs`
on an empty store, each a fresh interpreter, against `python -c "import torch"`.

    python bench/bench_cli_start.py [--repeats 7]

Prints the median wall of each (seconds) and the 1-minute load average, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPDIFF = str(Path(sys.executable).with_name("opdiff"))


def wall(argv: list[str], cwd: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        load = os.getloadavg()[0]
        out = {
            "opdiff --help": wall([OPDIFF, "--help"], tmp, args.repeats),
            "opdiff runs (empty store)": wall([OPDIFF, "runs"], tmp, args.repeats),
            "python -c 'import torch'": wall([sys.executable, "-c", "import torch"], tmp, args.repeats),
            "load_1min": load,
        }
    print(json.dumps({k: round(v, 3) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
