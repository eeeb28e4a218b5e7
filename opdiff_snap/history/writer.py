"""Writing one run's history file: `RunWriter.start` makes a new run, `RunWriter.resume`
reopens an interrupted one and appends the missing items to the same file, then the end
line (with `"resumed": <items carried over>`).

Each line goes to the OS in one write as soon as it is known, so a killed run loses at
most the line being written. A write that fails (disk full, read-only store) stops the
run with HistoryWriteError; the lines before it stay, and the run reads as interrupted.

A local store's folder holds the file as it is written; into a store behind an s3:// URL
it is written through a local spool and uploaded at intervals (storage/runs_remote.py).

Ctrl-C in a run (KeyboardInterrupt through the writer's `with` block) becomes Interrupted,
whose message says what is true of the run: the results written stay, and how to go on
(a check is resumed, a record run is run again).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping, Sequence

from ..core.environment import environment
from ..core.errors import Interrupted, OpdiffError
from ..core.limits import MAX_HISTORY_LINE_BYTES
from ..core.trees import json_safe
from ..core.verdicts import Verdict
from ..storage import StorageError, open_runs
from ..storage.run_store import RunFileError, Runs, Uploads, os_reason, utc_now
from .runs import ItemKey, RunFile, check_store_dir, item_key, parse_run, resumability, tally


class HistoryWriteError(OpdiffError):
    """The history store could not be written; the lines already written stay."""


def _dumps(obj: Mapping[str, Any]) -> bytes:
    try:
        text = json.dumps(obj, allow_nan=False)
    except ValueError:  # a NaN/Inf somewhere
        text = json.dumps(json_safe(obj), allow_nan=False)
    return (text + "\n").encode("utf-8")


def _new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class RunStart:
    """What a new run's meta line says of it: the command and its arguments, the suites,
    the presets with their options, the run's settings, the baseline (record), the
    environment (default: this one's), the `plan` a resume must reproduce exactly
    (selection, items, presets), the run group and shard, and `extra` keys of the caller's
    own (the pytest plugin's `runner`)."""

    command: str
    argv: Sequence[str]
    suites: Sequence[str]
    presets: dict[str, dict]
    settings: dict
    baseline_preset: str | None = None
    env: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    extra: Mapping[str, Any] | None = None
    run_group: str | None = None
    shard: str | None = None


class RunWriter:
    """Appends the lines of one run. Use `RunWriter.start(...)` or `RunWriter.resume(...)`.

    As a context manager it closes the file on exit; leaving on an exception writes no end
    line, so the run reads as interrupted (and a check stays resumable); Ctrl-C leaves it
    as Interrupted, whose message says so.
    Every line is handed to the OS in one unbuffered write; `fsync=True` also forces it
    to disk (slower; survives a power cut, not only a killed process). `uploads` says when
    the file reaches its store (storage/run_store.py); the spool file of a remote run is held
    locked while it is open, so no other command takes it for one whose writer died.
    """

    def __init__(self, path: Path, run_id: str, meta: dict[str, Any], *, fsync: bool = False,
                 prior: Iterable[Mapping[str, Any]] = (), uploads: Uploads | None = None,
                 file: IO[bytes] | None = None, recovered: dict[str, Any] | None = None):
        self.path = Path(path)
        self.uploads = uploads or Uploads()
        self.run_id = run_id
        self.meta = meta
        self.fsync = fsync
        self.recovered = recovered
        prior = list(prior)
        self.resumed = len(prior)              # items carried over from an interrupted session
        self._prior_counts = tally(prior)
        self._counts: dict[str, int] = {}      # this session's items by status
        self.keys: set[ItemKey] = set()        # every item in the file, prior ones included
        self.duplicates: list[ItemKey] = []
        for item in prior:
            self._note(item)
        try:
            self._file = file if file is not None else open(self.path, "ab", buffering=0)
        except OSError as exc:
            raise HistoryWriteError(f"cannot open the run file {self.path} for writing ({os_reason(exc)}): the "
                                    "history store must be writable. Fix its permissions or point --store "
                                    "at a writable folder; nothing was run.") from None
        self.ended = False

    # -- construction

    @classmethod
    def start(cls, store_dir: Path | str, start: RunStart, *, fsync: bool = False) -> "RunWriter":
        """Create <store_dir>/runs/<YYYYmmddTHHMMSSZ>-<6 hex>.jsonl and write the meta line.
        For a remote store the file is spooled locally and uploaded (storage/runs_remote.py)."""
        check_store_dir(store_dir)
        store = open_runs(store_dir)
        _store_call(store, "open", store.push_pending)
        runs = store.writing_dir
        try:
            runs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryWriteError(f"cannot create the history folder {runs} ({os_reason(exc)}). Check --store "
                                    "and that it is writable; nothing was run.") from None
        env = environment() if start.env is None else start.env
        while True:
            run_id = _new_run_id()
            path = runs / f"{run_id}.jsonl"
            try:
                file = open(path, "xb", buffering=0)
            except FileExistsError:
                continue
            except OSError as exc:
                raise HistoryWriteError(f"cannot create a run file in {runs} ({os_reason(exc)}): the history "
                                        "store must be writable. Fix its permissions or point --store at a "
                                        "writable folder; nothing was run.") from None
            try:
                if _store_call(store, "create the run in", lambda f=file, i=run_id: store.claim(f, i), path):
                    break
            except BaseException:
                file.close()
                path.unlink(missing_ok=True)
                raise
            file.close()
            path.unlink(missing_ok=True)   # another machine has a run of this id
        meta = {"type": "meta", "run_id": run_id, "command": start.command, "argv": list(start.argv),
                "started": utc_now(), "host": env.get("host"), "os": env.get("os"),
                "machine": env.get("machine"), "suites": [str(s) for s in start.suites],
                "baseline_preset": start.baseline_preset, "presets": start.presets,
                "env": {k: v for k, v in env.items() if k not in ("host", "os", "machine")},
                "settings": start.settings, "resumes": None}
        if start.run_group is not None:
            meta["run_group"] = start.run_group
        if start.shard is not None:
            meta["shard"] = start.shard
        if start.plan is not None:
            meta["plan"] = start.plan
        for key, value in (start.extra or {}).items():
            meta.setdefault(key, value)
        writer = cls(path, run_id, meta, fsync=fsync, uploads=store.uploads(path), file=file)
        writer._write(meta)
        writer.upload()
        return writer

    @classmethod
    def resume(cls, store_dir: Path | str, run_id: str, *, fsync: bool = False,
               accept: Callable[[RunFile], None] | None = None) -> tuple["RunWriter", set[ItemKey]]:
        """Reopen an interrupted run for appending. Returns the writer and the
        (test id, seed, preset) keys already in the file, which the caller skips.
        `accept(run)` may refuse (raise) before anything is written; then a partial last
        line (the process died mid-write) is cut off. A remote store's run is resumed from
        its latest upload (or this machine's spool of it) and uploaded as it grows."""
        check_store_dir(store_dir)
        store = open_runs(store_dir)
        path = _store_call(store, "fetch the run from", lambda: store.find(run_id))
        try:
            run, file = store.reopen(path, lambda data, at: _resumable(data, at, accept))
        except RunFileError as exc:
            raise (HistoryWriteError if exc.writing else OpdiffError)(str(exc)) from None
        assert run.meta is not None
        writer = cls(path, run.meta.get("run_id", path.stem), run.meta, fsync=fsync, prior=run.items,
                     uploads=store.uploads(path), file=file, recovered=run.recovered)
        return writer, run.keys()

    # -- writing

    def _write(self, obj: Mapping[str, Any]) -> None:
        if self._file.closed:
            raise ValueError(f"run {self.run_id} is closed")
        data = memoryview(_dumps(obj))
        if len(data) > MAX_HISTORY_LINE_BYTES:
            raise HistoryWriteError(f"run {self.run_id}: a {obj.get('type', 'history')} line of {len(data):,} bytes "
                                    f"is longer than the {MAX_HISTORY_LINE_BYTES:,} a history line may hold, so "
                                    "it was not written; make what it records smaller (options, messages).")
        try:
            while data:  # an unbuffered write may take only part of a line (a nearly full disk)
                data = data[self._file.write(data):]
            if self.fsync:
                os.fsync(self._file.fileno())
        except OSError as exc:
            self.close()
            then = (f"`opdiff check --resume {self.run_id}` finishes it once there is room"
                    if self.meta.get("command") == "check" else "run it again once there is room")
            raise HistoryWriteError(f"cannot append to the run file {self.path} ({os_reason(exc)}): the disk may "
                                    "be full or the history store read-only. The run stopped here; the "
                                    f"lines it wrote stay and it reads as interrupted; {then}.") from None

    def item(self, record: Mapping[str, Any]) -> None:
        """Append one item line (adds type, run_id and ts). NaN/Inf floats become strings."""
        line = {"type": "item", "run_id": self.run_id}
        line.update(record)
        line["type"], line["run_id"] = "item", self.run_id
        line.setdefault("ts", utc_now())
        self._write(line)
        self._note(line)
        status = str(line.get("status"))
        self._counts[status] = self._counts.get(status, 0) + 1
        if self.uploads.due():
            self.upload()

    def upload(self) -> None:
        """Upload the run file as it is now (a local store's has nothing to upload)."""
        try:
            self.uploads.now()
        except StorageError as exc:
            self.close(upload=False)
            then = (f"`opdiff check --resume {self.run_id}` finishes it once the service is reachable"
                    if self.meta.get("command") == "check" else "run it again once the service is reachable")
            raise HistoryWriteError(f"cannot upload run {self.run_id} to the history store: {exc} The run "
                                    f"stopped here; what it wrote is kept in {self.path}, and the next opdiff "
                                    f"command on this store uploads it; {then}.") from None

    def _note(self, item: Mapping[str, Any]) -> None:
        key = item_key(item)
        if key is None:
            return
        if key in self.keys:
            self.duplicates.append(key)
        self.keys.add(key)

    def end(self, counts: Mapping[str, int], wall_s: float) -> None:
        """Write the end line and close. `counts` and `wall_s` are this session's; a resumed
        run adds the tallies of the items that were already in the file."""
        total = dict(self._prior_counts)
        for k, v in counts.items():
            key = str(getattr(k, "value", k))
            total[key] = total.get(key, 0) + int(v)
        end: dict[str, Any] = {"type": "end", "run_id": self.run_id, "finished": utc_now(),
                               "wall_s": round(float(wall_s), 6), "counts": total, "resumed": self.resumed}
        if self.recovered is not None:
            end["recovered"] = self.recovered
        self._write(end)
        self.ended = True
        try:
            self.uploads.now()   # still holding the spool file: no other command pushes it meanwhile
        except StorageError as exc:
            self._file.close()
            raise HistoryWriteError(f"run {self.run_id} finished, but its history could not be uploaded: "
                                    f"{exc} It is kept in {self.path}; the next opdiff command on this "
                                    "store uploads it.") from None
        self._file.close()
        self.uploads.done()   # in the store now; a spool keeps unfinished runs only

    def close(self, upload: bool = True) -> bool:
        """Close the file; a remote run that stops early uploads what it has first (best
        effort: when this upload fails, its previous upload stays the store's copy and the
        next command on the store uploads the rest from the spool). False when that upload
        failed."""
        if self._file.closed:
            return True
        uploaded = True
        if upload and not self.ended:
            try:
                self.uploads.now()
            except (StorageError, OSError):
                uploaded = False
        self._file.close()
        return uploaded

    def interrupted(self, uploaded: bool = True) -> str:
        """What is true of this run after Ctrl-C, and how to go on."""
        n = sum(self._counts.values())
        kept = (f"the {n} results it wrote before the interruption stay in its history" if n else
                "it had written no results yet")
        if self.meta.get("command") == "record":
            goldens = self._counts.get(Verdict.RECORDED.value, 0)
            text = (f"interrupted: record run {self.run_id} stopped; {kept}, and the {goldens} goldens it "
                    "recorded are kept. A record run is not resumed: run `opdiff record` again, it records "
                    "only the goldens still missing")
        else:
            resumable, note = resumability(self.meta)
            then = f"`opdiff check --resume {self.run_id}` finishes it" if resumable else note
            text = f"interrupted: run {self.run_id} stopped; {kept}; {then}"
        if not uploaded:
            text += (f". Its last lines could not be uploaded; they are kept in {self.path}, and the next "
                     "opdiff command on this store uploads them")
        return text + "."

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        uploaded = self.close()
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and not isinstance(exc, Interrupted):
            raise Interrupted(self.interrupted(uploaded)) from None

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown
        try:
            self.close(upload=False)
        except Exception:
            pass


def _resumable(data: bytes, path: Path, accept: Callable[[RunFile], None] | None) -> RunFile:
    """The parsed run of `data`, if it can be resumed (and `accept` does not refuse it)."""
    run = parse_run(data, path)
    if run.end is not None:
        raise OpdiffError(f"run '{path.stem}' is complete (it has an end line); there is "
                          "nothing to resume. Start a new run instead.")
    if run.meta is None:
        raise OpdiffError(f"run file {path} has no readable meta line, so it cannot be "
                          "resumed. Start a new run; delete the file if it is junk.")
    if accept is not None:
        accept(run)
    return run


def _store_call(store: Runs, doing: str, fn, path: Path | None = None):
    """Run a call on a history store, a failure to reach it as one clear HistoryWriteError."""
    try:
        return fn()
    except StorageError as exc:
        if path is not None:
            path.unlink(missing_ok=True)
        raise HistoryWriteError(f"cannot {doing} the history store {store.url}: {exc} Nothing was "
                                "run.") from None
