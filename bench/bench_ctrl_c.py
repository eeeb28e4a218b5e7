"""Ctrl-C on `opdiff query`, many times, at random moments: how often it ends as promised
(exit 130, "opdiff: interrupted; the query was stopped" once the history is being read,
"opdiff: interrupted." before; nothing on stdout, the history untouched) and how often
some other way (an internal error, a traceback, a hang).

    python bench/bench_ctrl_c.py [--tries 20] [--load 2] [--copies 200]

A history is made once by a real `opdiff check` of a few shipped tests on torch_cpu_fp32,
its run file copied `--copies` times so that loading it takes a while; then each try starts
`opdiff query` on a runaway statement, with the history cache removed, and sends SIGINT
after a random delay of 0.2 to 4 s (start-up, loading the history, or the statement).
`--load N` keeps N busy processes spinning meanwhile. Prints the tally and the load as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, load

CLI = [sys.executable, str(ROOT / "cli.py")]
RUNAWAY = "SELECT count(*) FROM range(10000000) a, range(100000) b, range(1000) c"
PROMISE = "opdiff: interrupted; the query was stopped"


def spin() -> None:
    while True:
        pass


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def make_history(project: Path, copies: int) -> None:
    shutil.copytree(ROOT / "suites", project / "suites")
    shutil.copytree(ROOT / "goldens", project / "goldens")
    subprocess.run([*CLI, "check", "--backend", "torch_cpu_fp32", "--test-ids", "abs;add*;mul*"],
                   cwd=project, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = sorted((project / "store" / "runs").glob("*.jsonl"))
    if not runs:
        raise SystemExit("the check wrote no run file")
    for i in range(copies):
        shutil.copy(runs[0], runs[0].with_name(f"{runs[0].stem}-copy{i:04d}.jsonl"))


def one_try(project: Path, delay: float) -> str:
    (project / "store" / "cache.duckdb").unlink(missing_ok=True)
    proc = subprocess.Popen([*CLI, "query", RUNAWAY], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    if proc.poll() is not None:
        return f"ended before the signal (exit {proc.returncode})"
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "still running 30 s after Ctrl-C"
    if proc.returncode == 130 and PROMISE in err and out == "" and "Traceback" not in err:
        return "as promised: the query was stopped"
    if proc.returncode == 130 and err.strip() == "opdiff: interrupted." and out == "":
        return "as promised: interrupted before the query began"
    return f"exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else '(no message)'}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tries", type=int, default=20)
    ap.add_argument("--load", type=int, default=2, help="busy processes alongside")
    ap.add_argument("--copies", type=int, default=200, help="copies of the run file in the history")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for s in spinners:
        s.start()
    tally: dict[str, int] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="opdiff-ctrlc-") as tmp:
            project = Path(tmp)
            make_history(project, args.copies)
            history = digest(project / "store" / "runs")
            for _ in range(args.tries):
                outcome = one_try(project, rng.uniform(0.2, 4.0))
                if digest(project / "store" / "runs") != history:
                    outcome += " (the history changed)"
                tally[outcome] = tally.get(outcome, 0) + 1
    finally:
        for s in spinners:
            s.terminate()
    print(json.dumps({"tries": args.tries, "outcomes": tally, "busy_processes": args.load,
                      "load_1min": round(load(), 2)}, indent=1))


if __name__ == "__main__":
    main()
