"""Where the run history lives: the seam between the history (history/runs.py) and its store.

A history store holds `runs/<run id>.jsonl`. `open_runs(location)` (open.py) gives the one object the
history talks to, whatever the location is:

- `LocalRuns`: a local folder; a run file is written in place, and read where it lies.
- `RemoteRuns` (runs_remote.py): a store behind an s3:// URL; a run file is written into a
  local spool and uploaded at intervals, and the history is read from a local mirror.

Both offer the same operations: `push_pending` (what an earlier command left to upload),
`writing_dir` and `claim` (where a new run file is created, and its id made the run's),
`uploads` (when a run being written reaches the store), `find` and `reopen` (a run to
resume, opened for appending), `readable` (a local folder holding the runs/ to read) and
`restore` / `accept` (what to do when the store lacks runs this machine's mirror has).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Callable, TypeVar

from ..core.errors import OpdiffError

RUNS_DIR = "runs"
T = TypeVar("T")


def utc_now() -> str:
    """ISO 8601 UTC with milliseconds, e.g. 2026-11-22T05:12:00.123Z."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class RunFileError(OpdiffError):
    """A run file to resume could not be read or repaired. `writing`: the failure was a
    write (the history store or the spool must be made writable)."""

    def __init__(self, message: str, writing: bool):
        super().__init__(message)
        self.writing = writing


def is_line(raw: bytes) -> bool:
    """Whether `raw` is one whole line of a run file (a JSON object)."""
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


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


class Uploads:
    """When a run being written reaches its store. A local run is in the store as it is
    written: nothing is ever due, and there is nothing to upload or drop."""

    def due(self) -> bool:
        """Counts one more item; True when the run file should be uploaded now."""
        return False

    def now(self) -> None:
        """Upload the run file as it is now."""

    def done(self) -> None:
        """The run ended and its last upload succeeded: drop what only the upload needed."""


class Runs(ABC):
    """The runs/ of one history store, as the history writes and reads them."""

    url: str   # how messages name the store

    def push_pending(self) -> list[str]:
        """Upload what this machine kept of earlier runs beyond the store's copy; the ids
        of interrupted runs completed that way."""
        return []

    @property
    @abstractmethod
    def writing_dir(self) -> Path:
        """The local folder a new run file is created in."""

    def claim(self, file: IO[bytes], run_id: str) -> bool:
        """Make the new run file `file` (just created, empty) run `run_id`'s in the store;
        False when another run of that id exists there (pick another id)."""
        return True

    def uploads(self, path: Path) -> Uploads:
        """When the run file at `path`, being written, reaches the store."""
        return Uploads()

    @abstractmethod
    def find(self, run_id: str) -> Path:
        """The local file of `run_id` (or of the one run whose id starts with it)."""

    @abstractmethod
    def reopen(self, path: Path, check: Callable[[bytes, Path], T]) -> tuple[T, IO[bytes] | None]:
        """Open the run file at `path` to append to it: `check(data, path)` may refuse it
        (raise) before anything is written; then a partial last line is cut off (one that
        lost only its newline gets it back). Returns what `check` returned, and the file
        opened for appending (None: the caller opens `path` itself). Raises RunFileError."""

    @abstractmethod
    def readable(self) -> Path:
        """A local folder holding the store's runs/ as they are now."""

    @abstractmethod
    def restore(self) -> str:
        """Put the runs the store lacks back from this machine's mirror; says what was done."""

    @abstractmethod
    def accept(self) -> str:
        """Take the store as it is, setting aside this machine's copies it lacks; says what
        was done."""


class LocalRuns(Runs):
    """A history store in a local folder: run files are written and read where they lie."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = str(self.root)

    @property
    def writing_dir(self) -> Path:
        return self.root / RUNS_DIR

    def find(self, run_id: str) -> Path:
        runs = self.root / RUNS_DIR
        files = {p.stem: p for p in (sorted(runs.glob("*.jsonl")) if runs.is_dir() else [])}
        return files[match_run_id(list(files), run_id, runs)]

    def reopen(self, path: Path, check: Callable[[bytes, Path], T]) -> tuple[T, IO[bytes] | None]:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RunFileError(f"cannot read the run file {path} ({os_reason(exc)}).", writing=False) from None
        checked = check(data, path)
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            try:
                with open(path, "r+b") as f:
                    if tail.strip() and not is_line(tail):   # unparseable partial line: drop it
                        f.truncate(cut)
                    else:                                  # a whole line that lost only its newline
                        f.seek(0, os.SEEK_END)
                        f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise RunFileError(f"cannot repair the end of the run file {path} to resume it ({os_reason(exc)}); "
                                   "make the history store writable and try again.", writing=True) from None
        return checked, None

    def readable(self) -> Path:
        return self.root

    def restore(self) -> str:
        raise self._not_remote()

    def accept(self) -> str:
        raise self._not_remote()

    def _not_remote(self) -> OpdiffError:
        return OpdiffError(f"--restore and --accept-store are for a history store behind an s3:// URL; "
                           f"{self.root} is a local folder, read as it is.")


def os_reason(exc: OSError) -> str:
    """What went wrong, in the system's words."""
    return exc.strerror or str(exc)
