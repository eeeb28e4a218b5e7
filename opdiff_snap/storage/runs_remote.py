"""A history store behind a URL (s3://bucket/prefix): the same `runs/<run id>.jsonl` files,
written through a local spool and read through a local mirror (runs.Runs).

Writing: a run streams its JSONL into a local spool file, line by line as always, and
uploads the whole file when it starts (create-only, so two machines can never claim the
same run id), every UPLOAD_EVERY_S seconds or UPLOAD_EVERY_ITEMS items while it runs, and
when it ends or stops. Its writer holds an exclusive lock on the spool file while the run
is open; the system drops it when the writer dies, however it dies. The next command that
opens the store uploads what the spool holds beyond the store's copy: a finished run whose
final upload failed, and an interrupted run whose writer is gone (killed, or stopped while
the service was unreachable), the latter with a `recovered` line saying so. `check --resume`
on any machine downloads the store's copy (or takes this machine's spool, which is never
older) and finishes it.

Reading: `opdiff runs`, `query`, the reports and `diff-runs` read a local mirror of the
store's runs/, synced incrementally (only files whose size or time changed are
downloaded), so DuckDB's own cache of the parsed history (analytics/views.py) stays
incremental too. Measured against DuckDB reading the JSONL over an fsspec filesystem in
docs/benchmarks.md. The mirror never loses a run the store no longer has, or has less of:
syncing then stops with an error saying what differs, until the user restores the store
from the mirror or accepts the store as it is (`opdiff runs --restore / --accept-store`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Callable, TypeVar

from ..core.errors import OpdiffError
from .place import local_copy_dir
from .run_store import RUNS_DIR, RunFileError, Runs, Uploads, is_line, match_run_id, os_reason, utc_now
from .s3 import S3Place

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: a spool file is never taken for an abandoned one
    fcntl = None  # type: ignore[assignment]

UPLOAD_EVERY_S = float(os.environ.get("OPDIFF_UPLOAD_EVERY_S", "10"))
UPLOAD_EVERY_ITEMS = int(os.environ.get("OPDIFF_UPLOAD_EVERY_ITEMS", "100"))
ABANDONED_EMPTY_S = 3600.0   # a spool file without its meta line, unlocked this long, is dropped
SET_ASIDE = "set-aside"      # where `--accept-store` moves the mirror's copies the store lacks
T = TypeVar("T")


class SpoolBusy(OpdiffError):
    """Another process on this machine is writing the run."""


def hold(f: IO[bytes], run_id: str = "", wait_s: float = 0.0) -> bool:
    """Take the exclusive lock on an open spool file: True when taken; False when another
    open file holds it (its writer is alive) or the file system has no locks. A writer
    (`run_id` given) waits up to `wait_s` for a command that is only looking at the file,
    then raises SpoolBusy; a missing lock facility is fine for it."""
    if fcntl is None:
        return False
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            if run_id:
                raise SpoolBusy(f"run {run_id} is being written by another opdiff process on this machine "
                                f"({getattr(f, 'name', '')}); let it finish or stop it, then run this "
                                "again.") from None
            return False
        except OSError:
            return False   # no locks here (some network file systems): the writer goes on unguarded


class RemoteRuns(Runs):
    """The runs/ of a history store at `url`, and this machine's spool and mirror of it."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.place = S3Place(f"{self.url}/{RUNS_DIR}")
        self.spool = local_copy_dir(self.url, "spool") / RUNS_DIR
        self.mirror_root = local_copy_dir(self.url, "mirror")

    # ------------------------------------------------------------ writing

    @property
    def writing_dir(self) -> Path:
        return self.spool

    def claim(self, file: IO[bytes], run_id: str) -> bool:
        """Hold the new spool file locked, and create the run's object, empty, unless a run
        of that id exists (then False)."""
        hold(file, run_id, wait_s=2.0)
        return self.place.put(f"{run_id}.jsonl", b"", create=True)

    def upload(self, path: Path) -> None:
        self.place.upload(path, path.name)

    def uploads(self, path: Path) -> Uploads:
        return SpoolUploads(self, path)

    def push_pending(self) -> list[str]:
        """Upload what this machine's spool holds beyond the store's copy, then drop it from
        the spool: a finished run whose final upload failed, and an interrupted run whose
        writer is gone (its lines after the last upload, and a `recovered` line). A run whose
        writer is alive (it holds its spool file's lock) uploads itself. Returns the ids of
        the interrupted runs completed from the spool."""
        if not self.spool.is_dir():
            return []
        local = sorted(self.spool.glob("*.jsonl"))
        if not local:
            return []
        remote = {e.key: e.size for e in self.place.list()}
        completed = []
        for path in local:
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                continue   # pushed and dropped by another command meanwhile
            with f:
                if not hold(f):
                    continue
                if self._push_one(path, f.read(), remote.get(path.name),
                                  time.time() - os.fstat(f.fileno()).st_mtime):
                    completed.append(path.stem)
        return completed

    def _push_one(self, path: Path, data: bytes, stored_size: int | None, age_s: float) -> bool:
        """Push one spool file nobody writes; True when it completed an interrupted run."""
        name = path.name
        if _ends_with_end_line(data):
            if (stored_size if stored_size is not None else -1) < len(data):
                self.place.put(name, data)
            path.unlink(missing_ok=True)
            return False
        meta = _first_line(data)
        if meta is None:   # its writer died before the meta line: nothing of a run to keep
            if age_s > ABANDONED_EMPTY_S:
                path.unlink(missing_ok=True)
            return False
        data = whole_lines(data)
        stored = b""
        if stored_size:
            try:
                stored = self.place.get(name)
            except FileNotFoundError:
                stored = b""
        if stored.startswith(data):      # the store has all of it (or more: resumed elsewhere)
            path.unlink(missing_ok=True)
            return False
        if not data.startswith(stored):  # resumed elsewhere from an older copy: leave both alone
            return False
        items, before = _count_items(data), _count_items(stored)
        if items > before:
            note = {"type": "recovered", "run_id": meta.get("run_id", path.stem), "ts": utc_now(),
                    "host": socket.gethostname(), "items": items, "items_stored_before": before}
            data += (json.dumps(note) + "\n").encode()
        self.place.put(name, data)
        path.unlink(missing_ok=True)
        return items > before

    def find(self, run_id: str) -> Path:
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

    def reopen(self, path: Path, check: Callable[[bytes, Path], T]) -> tuple[T, IO[bytes] | None]:
        """The spool file, held locked from the first read on."""
        try:
            file = open(path, "r+b", buffering=0)
        except OSError as exc:
            raise RunFileError(f"cannot open the spooled run file {path} ({os_reason(exc)}); make it "
                               "writable and try again.", writing=True) from None
        try:
            hold(file, path.stem, wait_s=2.0)
            data = file.readall()
            checked = check(data, path)
            whole = whole_lines(data)
            if whole != data:   # a partial last line is dropped; one that lost only its newline gets it
                file.seek(0)
                file.truncate(0)
                file.write(whole)
                os.fsync(file.fileno())
            file.seek(0, os.SEEK_END)
        except OSError as exc:
            file.close()
            raise RunFileError(f"cannot repair the end of the spooled run file {path} to resume it "
                               f"({os_reason(exc)}); make it writable and try again.", writing=True) from None
        except BaseException:
            file.close()
            raise
        return checked, file

    # ------------------------------------------------------------ reading

    def readable(self) -> Path:
        return self.sync()

    def sync(self) -> Path:
        """Bring the local mirror up to date; returns the folder holding its runs/. Raises
        MirrorAhead, changing nothing, when the store lacks runs the mirror has or has less
        of one of them."""
        self.push_pending()
        mirror = self.mirror_root / RUNS_DIR
        mirror.mkdir(parents=True, exist_ok=True)
        remote = self._remote_runs()
        gone, shorter = self.differences(remote)
        if gone or shorter:
            raise MirrorAhead(self, remote, gone, shorter)
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
        return self.mirror_root

    def _remote_runs(self) -> dict[str, Any]:
        return {e.key: e for e in self.place.list() if e.key.endswith(".jsonl") and "/" not in e.key}

    def differences(self, remote: dict[str, Any]) -> tuple[list[Path], list[Path]]:
        """The mirror's run files the store lacks, and those the store holds less of."""
        mirror = self.mirror_root / RUNS_DIR
        files = sorted(mirror.glob("*.jsonl")) if mirror.is_dir() else []
        gone = [p for p in files if p.name not in remote]
        shorter = [p for p in files if p.name in remote and remote[p.name].size < p.stat().st_size]
        return gone, shorter

    def restore(self) -> str:
        """Upload the mirror's copies of the runs the store lacks or holds less of; says what
        was done."""
        self.push_pending()
        gone, shorter = self.differences(self._remote_runs())
        for path in gone:
            self.place.upload(path, path.name, create=True)
        for path in shorter:
            self.place.upload(path, path.name)
        if not gone and not shorter:
            return f"the history store {self.url} has every run of this machine's mirror; nothing to restore."
        return (f"restored {len(gone) + len(shorter)} runs into the history store {self.url} from this "
                f"machine's mirror: {_names(gone + shorter)}.")

    def accept(self) -> str:
        """Take the store as it is: the mirror's copies of the runs it lacks or holds less of
        move to a set-aside folder (kept, no longer read); says what was done."""
        self.push_pending()
        gone, shorter = self.differences(self._remote_runs())
        if not gone and not shorter:
            return f"this machine's mirror of {self.url} holds nothing the store lacks; nothing set aside."
        aside = self.mirror_root / SET_ASIDE / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        aside.mkdir(parents=True, exist_ok=True)
        for path in gone + shorter:
            shutil.move(str(path), str(aside / path.name))
        return (f"took the history store {self.url} as it is: {len(gone) + len(shorter)} runs of this "
                f"machine's mirror that it lacks or holds less of are kept in {aside}, no longer read: "
                f"{_names(gone + shorter)}.")


class MirrorAhead(OpdiffError):
    """The store lacks runs this machine's mirror of it holds, or holds less of one: nothing
    was changed, and the message says what differs and the two ways on."""

    def __init__(self, remote: RemoteRuns, runs: dict[str, Any], gone: list[Path], shorter: list[Path]):
        self.gone, self.shorter = gone, shorter
        parts = []
        if gone:
            parts.append(f"lacks {len(gone)} runs that this machine's mirror of it holds ({_names(gone)})")
        if shorter:
            parts.append(f"holds less of {len(shorter)} runs than the mirror does ({_names(shorter)})")
        super().__init__(
            f"the history store {remote.url} {' and '.join(parts)}: it has {len(runs)} runs, the mirror "
            f"{len(list((remote.mirror_root / RUNS_DIR).glob('*.jsonl')))}. The store was emptied or pruned, "
            "or the URL reaches another store now. Nothing was changed: the mirror in "
            f"{remote.mirror_root / RUNS_DIR} keeps them. `opdiff runs --restore` uploads them back into the "
            "store; `opdiff runs --accept-store` takes the store as it is and moves the mirror's copies "
            f"to {remote.mirror_root / SET_ASIDE}.")


def _names(paths: list[Path], shown: int = 5) -> str:
    names = [p.stem for p in paths]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def whole_lines(data: bytes) -> bytes:
    """`data` ending with a whole line: a last line cut short by a kill is dropped; one that
    lost only its newline gets it back."""
    if not data or data.endswith(b"\n"):
        return data
    cut = data.rfind(b"\n") + 1
    return data + b"\n" if is_line(data[cut:]) else data[:cut]


def _first_line(data: bytes) -> dict | None:
    """The meta line a run file starts with, or None."""
    head, newline, _ = data.partition(b"\n")
    try:
        line = json.loads(head) if newline else None
    except ValueError:
        return None
    return line if isinstance(line, dict) and line.get("type") == "meta" else None


def _count_items(data: bytes) -> int:
    n = 0
    for raw in data.splitlines():
        if b'"item"' in raw:
            try:
                n += json.loads(raw).get("type") == "item"
            except (ValueError, AttributeError):
                pass
    return n


def _ends_with_end_line(data: bytes) -> bool:
    try:
        line = json.loads(data.rstrip(b"\n").rsplit(b"\n", 1)[-1])
    except ValueError:
        return False
    return isinstance(line, dict) and line.get("type") == "end"


class SpoolUploads(Uploads):
    """When a run being written uploads its spool file: at start, every UPLOAD_EVERY_S
    seconds or UPLOAD_EVERY_ITEMS items, and at the end; once it ended and its last upload
    succeeded, the spool file goes (the spool keeps unfinished runs only)."""

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

    def done(self) -> None:
        self.path.unlink(missing_ok=True)
