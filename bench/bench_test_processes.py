"""Where the test suite's CPU goes: every Python process a pytest run starts, by kind.

    python bench/bench_test_processes.py [--top 25] -- [pytest arguments]
    python bench/bench_test_processes.py -- -n auto --dist loadfile tests/test_check_cli.py

Runs pytest with a `sitecustomize` first on PYTHONPATH that, at each interpreter's exit,
writes its pid, command line, CPU seconds (user + system, its own), whether it imported
torch and the test it ran under (PYTEST_CURRENT_TEST, inherited by what a test starts).
Then sums them: worker processes (multiprocessing's spawn), `opdiff` command lines,
pytest sessions a test starts (pytester), the rest; and per test file. Processes that
never exit normally (SIGKILLed, os._exit: xdist's own workers among them) and those run
with -I or -E are not counted; the pytest run's own wall time and the machine's idle
CPU over it (from /proc/stat) are printed beside.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT

HOOK = '''
import atexit, json, os, resource, sys, time

_FOLDER = os.environ.get("OPDIFF_BENCH_PROCESSES")
_TEST = os.environ.get("PYTEST_CURRENT_TEST", "")   # as inherited: the test that started this process


def _record():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {"argv": [str(a)[:160] for a in sys.orig_argv[:8]], "cpu_s": usage.ru_utime + usage.ru_stime,
              "torch": "torch" in sys.modules, "test": _TEST, "pid": os.getpid()}
    try:
        with open(os.path.join(_FOLDER, f"{os.getpid()}-{time.monotonic_ns()}.json"), "w") as f:
            json.dump(record, f)
    except OSError:
        pass


if _FOLDER:
    atexit.register(_record)
'''


def cpu_idle() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs so far."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def kind(argv: list[str]) -> str:
    line = " ".join(argv)
    if "spawn_main" in line or "forkserver" in line:
        return "worker (multiprocessing)"
    if "opdiff_snap.cli" in line or "cli.py" in line:
        return "opdiff command line"
    if "pytest" in line:
        return "pytest session started by a test"
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=25, help="test files to list")
    ap.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="opdiff-bench-procs-") as tmp:
        hook, folder = Path(tmp) / "hook", Path(tmp) / "records"
        hook.mkdir()
        folder.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        env = {**os.environ, "OPDIFF_BENCH_PROCESSES": str(folder),
               "PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)}
        idle0, total0 = cpu_idle()
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                                cwd=ROOT, env=env)
        proc.wait()
        wall = time.perf_counter() - started
        idle1, total1 = cpu_idle()
        records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for r in records:
        if r["pid"] == proc.pid:
            continue     # the run's own pytest
        k = kind(r["argv"])
        by_kind[k][0] += 1
        by_kind[k][1] += r["cpu_s"]
        by_kind[k][2] += bool(r["torch"])
        test_file = r["test"].split("::")[0] or "(outside a test)"
        by_file[test_file][0] += 1
        by_file[test_file][1] += r["cpu_s"]
    print(f"\npytest exit code {proc.returncode}, wall {wall:.1f} s, CPU idle "
          f"{100 * (idle1 - idle0) / max(1, total1 - total0):.1f} % of {os.cpu_count()} CPUs over the run")
    print(f"{'CPU s':>9} {'processes':>9} {'torch':>6}  kind")
    for name, (n, cpu, torch_in) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"{cpu:9.1f} {n:9d} {torch_in:6d}  {name}")
    print(f"\n{'CPU s':>9} {'processes':>9}  test file (processes a test started)")
    for name, (n, cpu) in sorted(by_file.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{cpu:9.1f} {n:9d}  {name}")


if __name__ == "__main__":
    main()
