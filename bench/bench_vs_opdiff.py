"""Side by side with the original opdiff on one opdiff-layout repository.

    python bench/bench_vs_opdiff.py --opdiff /path/to/opdiff [--opdiff-pythonpath DIR] [-j 2]

Builds a throwaway repository laid out as opdiff users lay theirs out (suites under
examples/, `file:` paths relative to the repository root, a module importing its sibling
as `examples.blocks`): the compatibility fixture from tests/compat/opdiff_layout plus
generated op tests, 46 tests in all. Then, from that repository's root, it times:

- opdiff in-process: `cli.py run S --backends 'torch_cpu_fp32;onnx_cpu_fp32' --baseline torch_cpu_fp32`
- opdiff isolated: the same with `--timeout-s 300` (a process per test and backend)
- ours: `record --baseline torch_cpu_fp32`, a cold `check -b onnx_cpu_fp32` (empty
  artifact cache), and a warm re-check (cache filled)

and prints wall seconds and the outcome counts of each. opdiff needs its own
requirements (pydantic) importable: pass `--opdiff-pythonpath` for a folder holding
them (`pip install --target DIR pydantic`). Without `--opdiff` only our side runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "compat" / "opdiff_layout"

UNARY = ["relu", "sigmoid", "tanh", "exp", "abs", "neg", "sin", "cos", "gelu", "silu",
         "erf", "floor", "ceil", "sign", "hardtanh", "elu"]
BINARY = ["mul.Tensor", "sub.Tensor", "div.Tensor", "maximum", "minimum", "atan2",
          "fmod.Tensor", "hypot"]


def op_suite() -> str:
    lines = ["include: suite.yaml", "", "presets:",
             "  big: {type: tensor, shape: [8, 16, 32], kind: float, init: normal}",
             "  pos: {type: tensor, shape: [8, 16, 32], kind: float, init: uniform, low: 0.5, high: 2}",
             "", "tests:"]
    for op in UNARY:
        lines += [f"  - id: op_{op}", f"    op: aten::{op}", "    in: [{ref: big}]"]
    for op in BINARY:
        name = op.split(".")[0]
        lines += [f"  - id: op_{name}", f"    op: aten::{op}", "    in: [{ref: big}, {ref: pos}]"]
    return "\n".join(lines) + "\n"


def build_repo(where: Path) -> Path:
    repo = where / "repo"
    shutil.copytree(FIXTURE, repo)
    (repo / "pyproject.toml").write_text("[project]\nname = 'bench-opdiff-layout'\n")
    (repo / "examples" / "bench.yaml").write_text(op_suite())
    return repo


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - t0, proc


def opdiff_counts(out: Path) -> dict:
    counts: collections.Counter = collections.Counter()
    for line in out.read_text().splitlines():
        row = json.loads(line)
        if row.get("type") != "item":
            continue
        for backend in row.get("backends", []):
            if backend["backend"] == "onnx_cpu_fp32":
                for res in backend["res"]:
                    counts[res["status"]] += 1
    return dict(counts)


def our_counts(store: Path) -> dict:
    runs = sorted((store / "runs").glob("*.jsonl"))
    counts: collections.Counter = collections.Counter()
    for line in runs[-1].read_text().splitlines():
        row = json.loads(line)
        if row.get("type") == "item":
            counts[row["status"]] += 1
    return dict(counts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opdiff", type=Path, help="a checkout of the original opdiff (its cli.py)")
    ap.add_argument("--opdiff-pythonpath", default="", help="extra import path for opdiff's requirements")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-vs-opdiff-"))
    try:
        repo = build_repo(work)
        suite = "examples/bench.yaml"
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        rows = []
        print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")

        ours = [sys.executable, str(ROOT / "cli.py"), "--goldens", str(work / "goldens"),
                "--store", str(work / "store"), "--cache", str(work / "cache")]
        wall, proc = timed(ours + ["list-tests", suite], repo, env)
        n_tests = len(proc.stdout.split())
        print(f"suite: {suite} in an opdiff-layout repository, {n_tests} tests")
        wall, proc = timed(ours + ["record", suite, "--baseline", "torch_cpu_fp32", "-j", str(args.jobs)], repo, env)
        rows.append(("ours: record (torch_cpu_fp32)", wall, f"exit {proc.returncode}"))
        for label in ("ours: check onnx_cpu_fp32, cold cache", "ours: re-check, warm cache"):
            wall, proc = timed(ours + ["check", suite, "-b", "onnx_cpu_fp32", "-j", str(args.jobs)], repo, env)
            rows.append((label, wall, f"exit {proc.returncode} {our_counts(work / 'store')}"))

        if args.opdiff is not None:
            peer_env = dict(env, PYTHONPATH=os.pathsep.join(
                p for p in (str(args.opdiff), args.opdiff_pythonpath) if p))
            for label, extra in (("opdiff run, in-process", []),
                                 ("opdiff run --timeout-s 300 (isolated)", ["--timeout-s", "300"])):
                out = work / f"opdiff-{len(rows)}.jsonl"
                cmd = [sys.executable, str(args.opdiff / "cli.py"), "run", suite,
                       "--backends", "torch_cpu_fp32;onnx_cpu_fp32", "--baseline", "torch_cpu_fp32",
                       "--out", str(out), *extra]
                wall, proc = timed(cmd, repo, peer_env)
                detail = opdiff_counts(out) if out.exists() else proc.stderr.strip().splitlines()[-1:]
                rows.append((label, wall, f"exit {proc.returncode} onnx: {detail}"))

        width = max(len(r[0]) for r in rows)
        for label, wall, detail in rows:
            print(f"{label:<{width}}  {wall:7.1f} s  {detail}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
