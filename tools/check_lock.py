"""Fail unless this environment holds exactly what requirements.lock pins.

    python tools/check_lock.py [--lock requirements.lock]

Reads `pip freeze --all --exclude-editable` of the interpreter that runs it and names
every package that is installed but not locked, locked but not installed, or installed
at another version. pip itself is left out: it is the installer the venv came with.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

IGNORED = {"pip"}


def pins(lines: list[str], where: str) -> dict[str, str]:
    """name -> version of each `name==version` line; comments and options skipped."""
    out: dict[str, str] = {}
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise SystemExit(f"{where}:{n}: '{line}' is not an exact pin (name==version)")
        out[canonicalize_name(req.name)] = specs[0].version
    return out


def differences(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    problems = []
    for name in sorted(set(locked) | set(installed)):
        if name in IGNORED:
            continue
        want, have = locked.get(name), installed.get(name)
        if want is None:
            problems.append(f"{name}=={have} is installed but not in the lock")
        elif have is None:
            problems.append(f"{name}=={want} is locked but not installed")
        elif want != have:
            problems.append(f"{name} is {have}, the lock says {want}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=Path(__file__).resolve().parents[1] / "requirements.lock")
    args = parser.parse_args(argv)
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    installed = pins(freeze, "pip freeze")
    problems = differences(pins(args.lock.read_text().splitlines(), str(args.lock)), installed)
    if problems:
        print(f"this environment differs from {args.lock.name} in {len(problems)} package(s):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        print("install with `pip install -c requirements.lock -e '.[test]'` into a fresh venv, or refresh "
              "the lock with tools/refresh-lock if the change is meant", file=sys.stderr)
        return 1
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    if check.returncode != 0:
        print("pip check found broken requirements:\n" + check.stdout + check.stderr, file=sys.stderr)
        return 1
    count = len(set(installed) - IGNORED)
    print(f"environment matches {args.lock.name}: {count} packages; pip check clean")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
