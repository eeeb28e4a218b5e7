"""torch.onnx.export with its table of ATen translations rebuilt on every call (torch as
it ships) against built once per process (what check does), on the same modules.

    python bench/bench_onnx_export.py [--exports 12]

Each mode runs in a fresh process and exports the same small modules in turn (a conv
block, a linear, a layer norm, a GELU, repeated to --exports calls); it reports the
first call and the median of the others, and whether the two modes wrote the very same
bytes. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = """
import hashlib, json, logging, statistics, sys, time, warnings
from pathlib import Path
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
import torch
from opdiff_snap.backends.onnx import onnx_export, reuse_torchlib_registry

mode, n, folder = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
if mode == "once":
    assert reuse_torchlib_registry(), "this torch lacks the hook"
torch.manual_seed(0)
cases = [(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()), (1, 3, 16, 16)),
         (torch.nn.Linear(16, 8), (4, 16)), (torch.nn.LayerNorm(16), (4, 16)), (torch.nn.GELU(), (4, 16))]
seconds, digest = [], hashlib.sha256()
for i in range(n):
    module, shape = cases[i % len(cases)]
    path = folder / f"{mode}{i}.onnx"
    start = time.perf_counter()
    onnx_export(module.eval(), (torch.randn(*shape),), {}, path)
    seconds.append(time.perf_counter() - start)
    digest.update(path.read_bytes())
print(json.dumps({"first_s": round(seconds[0], 3), "median_s": round(statistics.median(seconds[1:]), 3),
                  "total_s": round(sum(seconds), 2), "sha256": digest.hexdigest()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", type=int, default=12)
    args = parser.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("rebuilt", "once"):
            proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.exports), folder],
                                  capture_output=True, text=True, check=True)
            out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["same_bytes"] = out["rebuilt"].pop("sha256") == out["once"].pop("sha256")
    out["speedup_median"] = round(out["rebuilt"]["median_s"] / out["once"]["median_s"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
