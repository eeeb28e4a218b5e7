"""An environment with one op slowed down on purpose, compared with this one by interleaved rounds.

Builds environment B in a scratch folder: a venv without packages of its own that sees this
environment's site-packages, plus a startup hook that makes the worker run the test `tanh`
five times over (its other tests untouched). Then

    opdiff compare-envs --python B -b torch_cpu_fp32 --test-ids 'tanh;sigmoid;...' --rounds N

must report a latency change for tanh alone, with B slower. An A/A comparison (B without the
hook) must report none.

    python bench/bench_planted_slowdown.py [--rounds 6] [--repeats 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from benchlib import ROOT

TESTS = "tanh;sigmoid;exp;relu;neg;abs;sin;cos"

HOOK = '''
import dataclasses

import torch

from opdiff_snap.execution import runner

_flat_module = runner.flat_module


class _FiveTimes(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        for _ in range(4):
            self.inner(*args)
        return self.inner(*args)


def _slow_flat_module(case, invocation):
    prepared = _flat_module(case, invocation)
    if case.id == "tanh":
        prepared = dataclasses.replace(prepared, module=_FiveTimes(prepared.module))
    return prepared


runner.flat_module = _slow_flat_module
'''


def make_env(root: Path, slow: bool) -> Path:
    """A venv seeing this interpreter's site-packages (and, with `slow`, the hook)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    here = sysconfig.get_paths()["purelib"]
    (site / "00_this_environment.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    if slow:
        (site / "planted_slowdown.py").write_text(HOOK)
        (site / "zz_planted_slowdown.pth").write_text("import planted_slowdown\n")
    return root / "bin" / "python"


def compare(python: Path, store: Path, rounds: int, repeats: int) -> str:
    cmd = [sys.executable, "-m", "opdiff_snap.cli", "--store", str(store), "compare-envs", "--python", str(python),
           "-b", "torch_cpu_fp32", "--test-ids", TESTS, "--rounds", str(rounds), "--repeats", str(repeats),
           str(ROOT / "suites" / "core_aten.yaml")]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="opdiff-planted-env-"))
    for name, slow in (("A/A", False), ("planted", True)):
        python = make_env(scratch / f"env-{'slow' if slow else 'same'}", slow)
        report = compare(python, scratch / f"store-{'slow' if slow else 'same'}", args.rounds, args.repeats)
        section = report.split("latency changes", 1)[-1].split("delegation changes", 1)[0]
        print(f"{name}: latency changes{section.rstrip()}\n")


if __name__ == "__main__":
    main()
