"""Shared pieces of the hostile-input tests: a recorded project, CLI runs in a real
process (optionally under resource limits or without the power to ignore file
permissions), and snapshots of everything outside the store folders."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

from .. import REPO
from ..cli import run, start

STORE_DIRS = ("goldens", "store", ".opdiff-cache")
# the quickest honest run: one worker, one timed call
FAST = ("-j", "1", "--repeats", "1", "--warmup", "0")

SUITE = """\
tests:
  - id: add
    op: aten::add.Tensor
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal},
         {type: tensor, shape: [2, 4], dtype: float32, init: normal}]
  - id: relu
    op: aten::relu
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal}]
  - id: scale
    op: {type: module, path: "file:models.py::Scale", args: [{type: const, value: 4}]}
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal}]
  - id: big
    op: aten::neg
    in: [{type: tensor, shape: [128, 256], dtype: float32, init: normal}]
"""

MODELS = '''\
import torch
from torch import nn


class Scale(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 2.0, n))

    def forward(self, x):
        return x * self.weight
'''


def make_project(root: Path) -> Path:
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / "s.yaml").write_text(SUITE)
    (root / "suites" / "models.py").write_text(MODELS)
    return root


def env() -> dict[str, str]:
    """The environment of every CLI subprocess: this checkout first on the path, no
    bytecode files written next to the tests' modules."""
    return dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", COLUMNS="200",
                NO_COLOR="1")


def _limits(fsize: int | None, address_space: int | None, drop_dac: bool):
    def apply() -> None:
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if drop_dac and os.geteuid() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
                if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, effective after exec
                    os._exit(97)
    return apply


def run_cli(project: Path, *args: str, fsize: int | None = None, address_space: int | None = None,
            read_only_honoured: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python cli.py ARGS` in `project`. `fsize`: RLIMIT_FSIZE (a nearly full disk);
    `address_space`: RLIMIT_AS; `read_only_honoured`: file permissions bind even for root."""
    return run(project, *args, env=env(), timeout=timeout,
               preexec_fn=_limits(fsize, address_space, read_only_honoured))


def can_drop_dac() -> bool:
    """Whether a child can be made to honour file permissions (a non-root user always does)."""
    if os.geteuid() != 0:
        return True
    proc = subprocess.run(["true"], preexec_fn=_limits(None, None, True))
    return proc.returncode == 0


def snapshot(root: Path, skip: tuple[str, ...] = STORE_DIRS) -> dict[str, tuple]:
    """(size, mtime) of every file and the set of folders under `root`, except the store
    folders (their own contents are checked by the tests that need it)."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
        for d in dirnames:
            out[str(rel / d) + "/"] = ("dir",)
        for f in filenames:
            st = os.lstat(Path(dirpath) / f)
            out[str(rel / f)] = (st.st_size, st.st_mtime_ns)
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its contents (for 'nothing recorded was lost')."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_clean_failure(code: int, out: str, err: str, expect_code: int, *fragments: str) -> None:
    text = out + err
    assert code == expect_code, f"exit {code}, expected {expect_code}:\n{text[-3000:]}"
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    assert "internal error" not in text, text[-3000:]


def golden_meta(project: Path, test_id: str, seed: int = 0) -> Path:
    from opdiff_snap.goldens import store_key

    return project / "goldens" / store_key(test_id, seed) / "zarr.json"


def edit_attrs(project: Path, test_id: str, change) -> None:
    """Rewrite one golden's attributes with `change(attrs)` (as a hand edit would)."""
    path = golden_meta(project, test_id)
    meta = json.loads(path.read_text())
    change(meta["attributes"])
    path.write_text(json.dumps(meta))


def copy_project(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def dedent(text: str) -> str:
    return textwrap.dedent(text)


def query_interrupted(project: Path, sql: str, delay: float | None, *flags: str) -> tuple[int, str, str, float]:
    """`opdiff query FLAGS SQL` with the history cache removed, SIGINT `delay` s after the
    cache file appears (None: none): (exit code, stdout, stderr, seconds from the cache
    file to the end)."""
    cache = project / "store" / "cache.duckdb"
    cache.unlink(missing_ok=True)
    proc = start(project, "query", *flags, sql, env=env())
    try:
        deadline = time.monotonic() + 120
        while not cache.exists():   # the history is loaded into it right before the statement runs
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the query never started"
            time.sleep(0.002)
        appeared = time.monotonic()
        if delay is not None:
            time.sleep(delay)
            assert proc.poll() is None, proc.communicate()
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err, time.monotonic() - appeared
