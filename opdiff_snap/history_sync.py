"""A history store behind a URL (s3://bucket/prefix): the same `runs/<run id>.jsonl` files.

Writing: a run streams its JSONL into a local spool file, line by line as always, and
uploads the whole file when it starts (create-only, so two machines can never claim the
same run id), every UPLOAD_EVERY_S seconds or UPLOAD_EVERY_ITEMS items while it runs, and
when it ends or stops. A killed run's last upload is its remote copy: `check --resume`
on any machine downloads it (or takes this machine's spool, which is never older) and
finishes it. A finished run whose final upload failed stays in the spool and is uploaded
by the next command that opens the store.

Reading: `opdiff runs`, `query`, the reports and `diff-runs` read a local mirror of the
store's runs/, synced incrementally (only files whose size or time changed are
downloaded), so DuckDB's own cache of the parsed history (analytics/views.py) stays
incremental too. Measured against DuckDB reading the JSONL over an fsspec filesystem in
docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .errors import OpdiffError
from .storage import is_url, local_copy_dir, open_place

RUNS_DIR = "runs"
UPLOAD_EVERY_S = float(os.environ.get("OPDIFF_UPLOAD_EVERY_S", "10"))
UPLOAD_EVERY_ITEMS = int(os.environ.get("OPDIFF_UPLOAD_EVERY_ITEMS", "100"))


class RemoteRuns:
    """The runs/ of a history store at `url`, and this machine's spool and mirror of it."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.place = open_place(f"{self.url}/{RUNS_DIR}")
        self.spool = local_copy_dir(self.url, "spool") / RUNS_DIR
        self.mirror_root = local_copy_dir(self.url, "mirror")

    # ------------------------------------------------------------ writing

    def claim(self, run_id: str) -> bool:
        """Create the run's object, empty, unless a run of that id exists (then False)."""
        return self.place.put(f"{run_id}.jsonl", b"", create=True)

    def upload(self, path: Path) -> None:
        self.place.upload(path, path.name)

    def push_pending(self) -> int:
        """Upload finished spooled runs the store has less of (a final upload that failed),
        then drop them from the spool. A run still being written (here, by another process)
        uploads itself; pushing its partial copy could land after its final upload. Returns
        how many went up."""
        if not self.spool.is_dir():
            return 0
        local = {p.name: p for p in self.spool.glob("*.jsonl")}
        if not local:
            return 0
        remote = {e.key: e.size for e in self.place.list()}
        pushed = 0
        for name, path in sorted(local.items()):
            if not _ended(path):
                continue
            if remote.get(name, -1) < path.stat().st_size:
                self.upload(path)
                pushed += 1
            path.unlink(missing_ok=True)
        return pushed

    def fetch(self, run_id: str) -> Path:
        """The spool file of `run_id` (or of the one run whose id starts with it), downloaded
        unless this machine's spool already has at least as much of it."""
        remote = {e.key[:-6]: e.size for e in self.place.list() if e.key.endswith(".jsonl")}
        local = {p.stem: p.stat().st_size for p in self.spool.glob("*.jsonl")} if self.spool.is_dir() else {}
        found = match_run_id(sorted(set(remote) | set(local)), run_id, self.place.url)
        path = self.spool / f"{found}.jsonl"
        if local.get(found, -1) < remote.get(found, -1):
            self.spool.mkdir(parents=True, exist_ok=True)
            self.place.download(f"{found}.jsonl", path)
        return path

    # ------------------------------------------------------------ reading

    def sync(self) -> Path:
        """Bring the local mirror up to date; returns the folder holding its runs/."""
        self.push_pending()
        mirror = self.mirror_root / RUNS_DIR
        mirror.mkdir(parents=True, exist_ok=True)
        remote = {e.key: e for e in self.place.list() if e.key.endswith(".jsonl") and "/" not in e.key}
        for name, entry in remote.items():
            path = mirror / name
            try:
                st = path.stat()
                if st.st_size == entry.size and int(st.st_mtime) == int(entry.mtime):
                    continue
            except FileNotFoundError:
                pass
            self.place.download(name, path)
            os.utime(path, (entry.mtime, entry.mtime))
        for path in mirror.glob("*.jsonl"):
            if path.name not in remote:
                path.unlink(missing_ok=True)
        return self.mirror_root


def last_line(path: Path, size: int = 65536) -> bytes:
    """The last line of a run file (its end line, when the run finished)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        n = f.tell()
        f.seek(max(0, n - size))
        chunk = f.read()
    return chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1]


def _ended(path: Path) -> bool:
    """Whether a run file ends with its end line."""
    try:
        line = json.loads(last_line(path))
    except (OSError, ValueError):
        return False
    return isinstance(line, dict) and line.get("type") == "end"


def match_run_id(ids: list[str], run_id: str, where: object) -> str:
    """The one id of `ids` (oldest first) that is `run_id` or starts with it; otherwise
    one clear error naming the store (`where`)."""
    if run_id in ids:
        return run_id
    match = [i for i in ids if run_id and i.startswith(run_id)]
    if len(match) == 1:
        return match[0]
    if not ids:
        raise OpdiffError(f"run '{run_id}' not found: there are no runs in {where}. "
                          "Check --store, or start a new run instead of resuming one.")
    if match:
        raise OpdiffError(f"run id '{run_id}' is ambiguous in {where}: it starts "
                          f"{', '.join(match[-5:])}. Give the full run id.")
    raise OpdiffError(f"run '{run_id}' not found in {where}. The latest runs are: "
                      f"{', '.join(ids[-5:])} (`opdiff runs` lists them all).")


def readable_dir(store: Path | str) -> Path:
    """A local folder holding the store's runs/: the store itself, or the synced mirror of a
    remote one."""
    if is_url(store):
        return RemoteRuns(str(store)).sync()
    return Path(store)


class Uploads:
    """When a run being written uploads itself: at start, every UPLOAD_EVERY_S seconds or
    UPLOAD_EVERY_ITEMS items, and at the end."""

    def __init__(self, remote: RemoteRuns, path: Path):
        self.remote, self.path = remote, path
        self.last = time.monotonic()
        self.items = 0

    def due(self) -> bool:
        self.items += 1
        return self.items >= UPLOAD_EVERY_ITEMS or time.monotonic() - self.last >= UPLOAD_EVERY_S

    def now(self) -> None:
        self.remote.upload(self.path)
        self.last, self.items = time.monotonic(), 0
