"""Shared pieces of the record tests: tmp projects, a JSON record in this process, a plain-zarr reader."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

from ..cli import PY, invoke

HERE = Path(__file__).resolve().parent


def make_project(root: Path, suite_text: str, name: str = "s.yaml", models: bool = True) -> Path:
    """A project dir holding suites/<name> (and suites/models.py for `file:` modules)."""
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / name).write_text(textwrap.dedent(suite_text))
    if models:
        shutil.copy(HERE / "models.py", root / "suites" / "models.py")
    return root


def record_here(root: Path, suite_text: str, settings=None, name: str = "ops.yaml"):
    """Write suites/<name> under `root` and record it on the baseline in this process, from
    `root` as the working directory (default settings: one repeat, no warm-up); the report."""
    import contextlib

    from opdiff_snap import api
    from opdiff_snap.core.config import Settings

    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / name).write_text(suite_text)
    with contextlib.chdir(root):
        return api.record(api.RecordRequest(running=api.Running(in_process=True)),
                          settings=settings or Settings(repeats=1, warmup=0))


def statuses(report: dict) -> dict[tuple[str, int], str]:
    return {(r["id"], r["seed"]): r["status"] for r in report["results"]}


# Reads a whole golden store with zarr and numpy only, following docs/goldens-layout.md:
# every golden is a 1-D uint8 array; its attributes say where each tensor's bytes lie.
PLAIN_READER = textwrap.dedent("""
    import json, os, sys
    import numpy as np, zarr

    root = sys.argv[1]
    group = zarr.open_group(root, mode="r")
    out = {}
    for key, golden in group.arrays():
        attrs = dict(golden.attrs)
        raw = golden[...]
        arrays = {}
        for name, t in attrs["tensors"].items():
            piece = raw[t["offset"]:t["offset"] + t["nbytes"]]
            arr = piece.view(np.dtype(t["dtype"]).newbyteorder("<")).reshape(t["shape"])
            arrays[name] = {"hex": arr.tobytes().hex(), "shape": list(arr.shape),
                            "dtype": str(arr.dtype), "torch_dtype": t["torch_dtype"]}
        out[f"{attrs['test_id']}|{attrs['seed']}"] = {
            "key": key, "arrays": arrays,
            **{k: attrs[k] for k in ("args", "kwargs", "outputs", "states", "grads", "spec_hash")}}
    assert not any(m == "torch" or m.startswith(("torch.", "opdiff_snap")) for m in sys.modules)
    print(json.dumps(out))
""")


def read_plain(goldens: Path) -> dict:
    """{"<test id>|<seed>": {...}} of every golden in the store, read in a fresh process."""
    proc = subprocess.run([PY, "-c", PLAIN_READER, str(goldens)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def record_inproc(project: Path, *args: str) -> tuple[int, dict]:
    """`opdiff record --format json ARGS` in this process (jobs still run in workers)."""
    code, out, err = invoke(project, "record", "--format", "json", "--repeats", "1", "--warmup", "0", "-j", "1",
                            *args)
    try:
        return code, json.loads(out)
    except ValueError:
        raise AssertionError(f"no JSON report (rc {code}):\n{out}\n{err}") from None
