"""Side by side with the original opdiff on one opdiff-layout repository.

    python bench/bench_vs_opdiff.py --opdiff /path/to/opdiff [--opdiff-pythonpath DIR]
        [--opdiff-root-on-path] [--max-load 1.0] [-j 2] [--demo] [--skip-isolated]

Builds a throwaway repository laid out as opdiff users lay theirs out (suites under
examples/, `file:` paths relative to the repository root, a module importing its sibling
as `examples.blocks`): the compatibility fixture from tests/compat/opdiff_layout plus
generated op tests, 44 tests in all. Then, from that repository's root, it times:

- opdiff in-process: `cli.py run S --backends 'torch_cpu_fp32;onnx_cpu_fp32' --baseline torch_cpu_fp32`
- opdiff isolated: the same with `--timeout-s 300` (a process per test and backend)
- ours: `record --baseline torch_cpu_fp32`, a cold `check -b onnx_cpu_fp32` (empty
  artifact cache), and a warm re-check (cache filled)

and prints wall seconds and the outcome counts of each (per test, on onnx_cpu_fp32),
with the load average before every measured command. opdiff needs its own
requirements (pydantic) importable: pass `--opdiff-pythonpath` for a folder holding
them (`pip install --target DIR pydantic`). Without `--opdiff` only our side runs.
`--demo` runs opdiff's own demo instead (`examples/` of the `--opdiff` checkout, copied into
the throwaway repository, and its `examples/demo.yaml`: 40 tests after expansion), and
prints record + cold check against opdiff's in-process run as a ratio.
`--opdiff-root-on-path` adds one more opdiff row with the repository root on
PYTHONPATH, the way to make opdiff import `examples.blocks` when it is started from a
repository other than its own checkout (see opdiff_env). `--max-load L` waits, in 60 s
steps for at most 20 minutes, until the 1-minute load average is at most L.

opdiff deletes `tmp*`, `*opdiff*`, `*.onnx`, `onnxruntime-*`, ... in $TMPDIR (or
/tmp) at the end of every run (pipeline.utils.clean_sys_tmp), which would take this
script's work folder, the opdiff checkout and its requirements with it if they live in
/tmp, and other programs' temporary files too; so opdiff runs here with TMPDIR set to
a private folder inside the work folder.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, run_timed, wait_for_load

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


def build_demo_repo(where: Path, opdiff: Path) -> Path:
    repo = where / "repo"
    shutil.copytree(opdiff / "examples", repo / "examples")
    (repo / "pyproject.toml").write_text("[project]\nname = 'bench-opdiff-demo'\n")
    return repo


def timed_run(cmd: list[str], cwd: Path, env: dict) -> tuple[float, subprocess.CompletedProcess]:
    shown = ["python", *cmd[1:]] if cmd[0] == sys.executable else cmd
    print(f"load {load():.2f}, running: {shlex.join(shown)}", flush=True)
    return run_timed(cmd, cwd=cwd, env=env)


def _worst(statuses: list[str]) -> str:
    bad = [st for st in statuses if st != "OK"]
    return bad[0] if bad else "OK"


def opdiff_counts(out: Path, atol: float = 1e-5) -> tuple[dict, list[str]]:
    """Per-test outcome on onnx_cpu_fp32 from opdiff's JSONL (measure/jsonl_writter.py).

    One "meta" line per run, then one "item" line per test: `backends[]` holds one
    record per preset, whose `res[]` has one {status, err, ms} per side (two for a pair
    test), status OK / EXPORT_FAIL / INFER_FAIL / TIMING_FAIL / SKIPPED / TIMED_ERROR.
    opdiff gives no pass/fail verdict: `diff_all[0]` holds max_abs etc. against the
    baseline (single tests) or side a against side b (pairs). A test counts as OK when
    every side's status is OK, then as `OK, max_abs<=atol` or `OK, max_abs>atol`
    (`atol` = our fp32 default, for comparison with our PASS/MISMATCH).
    """
    counts: collections.Counter = collections.Counter()
    notes: list[str] = []
    for line in out.read_text().splitlines():
        row = json.loads(line)
        if row.get("type") != "item":
            continue
        for backend in row.get("backends", []):
            if backend["backend"] != "onnx_cpu_fp32":
                continue
            status = _worst([res["status"] for res in backend["res"]])
            if status == "OK" and backend.get("diff_all"):
                diff = backend["diff_all"][0]
                if not diff.get("ok"):
                    status = f"OK, diff failed ({diff.get('code')})"
                else:
                    status = f"OK, max_abs{'<=' if diff['max_abs'] <= atol else '>'}{atol:g}"
                    if diff["max_abs"] > atol:
                        notes.append(f"{row['id']}: max_abs={diff['max_abs']:.3g}")
            elif status != "OK":
                errs = [res.get("err") for res in backend["res"] if res.get("err")]
                err = re.sub(r"\x1b\[[0-9;]*m", "", str(errs[0])) if errs else ""
                notes.append(f"{row['id']}: {status} {err[:120]}")
            counts[status] += 1
    return dict(counts), notes


def our_counts(store: Path) -> tuple[dict, list[str]]:
    runs = sorted((store / "runs").glob("*.jsonl"))
    counts: collections.Counter = collections.Counter()
    notes: list[str] = []
    for line in runs[-1].read_text().splitlines():
        row = json.loads(line)
        if row.get("type") == "item":
            counts[row["status"]] += 1
            if row["status"] != "PASS":
                notes.append(f"{row['id']}: {row['status']} {(row.get('error_message') or '')[:120]}")
    return dict(counts), notes


def opdiff_env(env: dict, opdiff: Path, extra_path: str, tmpdir: Path, root: Path | None) -> dict:
    """opdiff's environment: its checkout and requirements importable, a private TMPDIR.

    `python /path/to/opdiff/cli.py` puts opdiff's own folder first on sys.path, not the
    current directory; opdiff's checkout has an `examples/` folder of its own, so a
    module that says `from examples.blocks import ...` finds opdiff's examples and fails
    unless the repository root is on PYTHONPATH too (`root`).
    """
    tmpdir.mkdir(parents=True, exist_ok=True)
    path = [str(opdiff), extra_path, str(root) if root else ""]
    return dict(env, PYTHONPATH=os.pathsep.join(p for p in path if p), TMPDIR=str(tmpdir))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opdiff", type=Path, help="a checkout of the original opdiff (its cli.py)")
    ap.add_argument("--opdiff-pythonpath", default="", help="extra import path for opdiff's requirements")
    ap.add_argument("--opdiff-root-on-path", action="store_true",
                    help="one more opdiff row, with the repository root on PYTHONPATH")
    ap.add_argument("--max-load", type=float, default=None,
                    help="wait (60 s steps, 20 min at most) until the 1-minute load is at most this")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--demo", action="store_true", help="opdiff's own examples/demo.yaml (needs --opdiff)")
    ap.add_argument("--skip-isolated", action="store_true", help="leave out opdiff's isolated run (minutes)")
    args = ap.parse_args()
    if args.demo and args.opdiff is None:
        ap.error("--demo needs --opdiff (the demo is opdiff's own)")

    work = Path(tempfile.mkdtemp(prefix="bench-vs-peer-"))
    try:
        repo = build_demo_repo(work, args.opdiff) if args.demo else build_repo(work)
        suite = "examples/demo.yaml" if args.demo else "examples/bench.yaml"
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        rows = []
        notes: dict[str, list[str]] = {}
        if args.max_load is not None:
            wait_for_load(args.max_load)
        print(f"load average before: {load():.2f} on {os.cpu_count()} cores", flush=True)

        ours = [sys.executable, str(ROOT / "cli.py"), "--goldens", str(work / "goldens"),
                "--store", str(work / "store"), "--cache", str(work / "cache")]
        proc = subprocess.run(ours + ["list-tests", suite], cwd=repo, env=env, capture_output=True, text=True)
        n_tests = len(proc.stdout.split())
        print(f"suite: {suite} in an opdiff-layout repository, {n_tests} tests", flush=True)
        wall, proc = timed_run(ours + ["record", suite, "--baseline", "torch_cpu_fp32", "-j", str(args.jobs)], repo,
                               env)
        rows.append(("ours: record (torch_cpu_fp32)", wall, f"exit {proc.returncode} {our_counts(work / 'store')[0]}"))
        for label in ("ours: check onnx_cpu_fp32, cold cache", "ours: re-check, warm cache"):
            wall, proc = timed_run(ours + ["check", suite, "-b", "onnx_cpu_fp32", "-j", str(args.jobs)], repo, env)
            counts, notes[label] = our_counts(work / "store")
            rows.append((label, wall, f"exit {proc.returncode} onnx: {counts}"))

        if args.opdiff is not None:
            runs = [("opdiff run, in-process", [], None)]
            if not args.skip_isolated:
                runs.append(("opdiff run --timeout-s 300 (isolated)", ["--timeout-s", "300"], None))
            if args.opdiff_root_on_path:
                runs.append(("opdiff run, in-process, repo root on PYTHONPATH", [], repo))
            for label, extra, root in runs:
                out = work / f"peer-{len(rows)}.jsonl"
                peer_env = opdiff_env(env, args.opdiff, args.opdiff_pythonpath, work / f"peer-tmp-{len(rows)}", root)
                cmd = [sys.executable, str(args.opdiff / "cli.py"), "run", suite,
                       "--backends", "torch_cpu_fp32;onnx_cpu_fp32", "--baseline", "torch_cpu_fp32",
                       "--out", str(out), *extra]
                wall, proc = timed_run(cmd, repo, peer_env)
                if out.exists():
                    detail, notes[label] = opdiff_counts(out)
                else:
                    detail = proc.stderr.strip().splitlines()[-1:]
                rows.append((label, wall, f"exit {proc.returncode} onnx: {detail}"))

        walls = {label: wall for label, wall, _ in rows}
        first_pass = walls["ours: record (torch_cpu_fp32)"] + walls["ours: check onnx_cpu_fp32, cold cache"]
        rows.append(("ours: record + cold check", first_pass, ""))
        print()
        width = max(len(r[0]) for r in rows)
        for label, wall, detail in rows:
            print(f"{label:<{width}}  {wall:7.1f} s  {detail}")
        if "opdiff run, in-process" in walls:
            print(f"\nrecord + cold check / opdiff in-process: {first_pass / walls['opdiff run, in-process']:.2f} "
                  f"(goal <= 0.3); warm re-check / cold check: "
                  f"{walls['ours: re-check, warm cache'] / walls['ours: check onnx_cpu_fp32, cold cache']:.3f}")
        for label, lines in notes.items():
            print(f"\n{label}: not passing / not OK or max_abs above 1e-5")
            for line in lines:
                print(f"  {line}")
        print(f"\nload average after: {load():.2f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
