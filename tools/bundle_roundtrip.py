"""A replay bundle's whole round trip on this machine, each runtime in a fresh virtual
environment that holds only that runtime and NumPy (from requirements.lock):

    python tools/bundle_roundtrip.py [SUITES...] [-b PRESET ...] [--work DIR]

bundles the suites (default suites/models.yaml on onnx_cpu_fp32 and executorch_cpu_fp32),
makes one venv per runtime family, runs each family's runner there, judges the returned
outputs with `opdiff check --outputs-from`, checks the same tests here, and compares the
two runs item by item (verdict, tolerance, the comparison's numbers; timings and run ids
aside). Prints what each venv holds and exits 1 when any item differs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = {"onnx": ["onnxruntime", "numpy"], "executorch": ["executorch", "torch", "numpy"],
            "coreml": ["coremltools", "numpy"]}
COMPARED = ("status", "tolerance", "precision_limited", "expected")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", default=["suites/models.yaml"])
    parser.add_argument("-b", "--backend", dest="presets", action="append")
    parser.add_argument("--work", type=Path, help="where the bundle, venvs, store and cache go (default: a temp dir)")
    args = parser.parse_args()
    presets = args.presets or ["onnx_cpu_fp32", "executorch_cpu_fp32"]
    work = args.work or Path(tempfile.mkdtemp(prefix="opdiff-roundtrip-"))
    work.mkdir(parents=True, exist_ok=True)
    bundle = work / "bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    opdiff = [sys.executable, str(ROOT / "cli.py"), "--store", str(work / "store"), "--cache", str(work / "cache")]
    t0 = time.perf_counter()
    _run([*opdiff, "bundle", *args.suites, *(f"-b{p}" for p in presets), "-o", str(bundle)], "bundle")
    print(f"bundled in {time.perf_counter() - t0:.1f} s: {bundle}")
    families = sorted({e["family"] for e in json.loads((bundle / "manifest.json").read_text())["entries"]})
    for family in families:
        python = _venv(work / f"venv-{family}", RUNTIMES[family])
        t0 = time.perf_counter()
        _run([str(python), str(bundle / f"run_{family}.py")], f"run_{family}.py")
        print(f"ran run_{family}.py in its venv in {time.perf_counter() - t0:.1f} s")
    replayed = _check([*opdiff, "check", "--outputs-from", str(bundle), *args.suites])
    here = _check([*opdiff, "check", *args.suites, *(f"-b{p}" for p in presets)])
    return _compare(replayed, here)


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.exit(f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def _venv(where: Path, packages: list[str]) -> Path:
    """A fresh venv at `where` with only `packages` (and what they need) from the lock."""
    shutil.rmtree(where, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "requirements.lock"), *packages], "pip")
    held = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                          check=True)
    names = sorted(f"{p['name']}=={p['version']}" for p in json.loads(held.stdout) if p["name"] not in
                   ("pip", "setuptools"))
    size = subprocess.run(["du", "-sm", str(where)], capture_output=True, text=True).stdout.split()[0]
    torch = "holds torch" if any(n.lower().startswith("torch==") for n in names) else "no torch"
    print(f"venv {where.name} ({time.perf_counter() - t0:.0f} s, {size} MB, {torch}): {len(names)} packages: "
          + " ".join(names))
    return python


def _check(cmd: list[str]) -> dict:
    proc = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode not in (0, 1):
        sys.exit(f"check failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _compare(replayed: dict, here: dict) -> int:
    a = {(r["id"], r["seed"], r["preset"]): r for r in replayed["results"]}
    b = {(r["id"], r["seed"], r["preset"]): r for r in here["results"]}
    differ = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if x is None or y is None:
            differ.append(f"{key}: only in {'the check here' if x is None else 'the replay'}")
            continue
        for field in COMPARED:
            if x.get(field) != y.get(field):
                differ.append(f"{key}: {field} {x.get(field)!r} (replay) != {y.get(field)!r} (here)")
        mx, my = (x.get("metrics") or {}).get("max_abs"), (y.get("metrics") or {}).get("max_abs")
        if mx != my:
            differ.append(f"{key}: max_abs {mx!r} (replay) != {my!r} (here)")
    counts: dict[str, int] = {}
    for r in a.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"replayed run {replayed['run_id']} and the check here {here['run_id']}: {len(a)} and {len(b)} items; "
          f"verdicts {counts}; {len(differ)} differences")
    for line in differ[:40]:
        print("  " + line)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
