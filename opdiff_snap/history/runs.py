"""The run history as it is read: one JSONL file per run under <store>/runs/.

Line types (docs/architecture.md, "History format"): one `meta` line first, one `item`
line per (test, seed, preset) result, and an `end` line with the tallies. A file without
an `end` line was interrupted (history/writer.py writes the files, and resumes them).

A killed run loses at most the line being written: readers skip a truncated last line
and report it. Where the run files lie is the history store's business (storage/run_store.py):
a store behind an s3:// URL is read through a local mirror (storage/runs_remote.py). The
lines of an interrupted run that reached the store only after its writer died (from this
machine's spool) are followed by a `recovered` line saying so; readers skip it, and
`opdiff runs` shows it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..core.errors import OpdiffError
from ..storage import occupied_by_file, open_runs
from ..storage.run_store import RUNS_DIR

ItemKey = tuple[str, int, str]  # (test id, seed, preset)


def check_store_dir(store_dir: Path | str) -> None:
    """Raise OpdiffError when the history store path is a file."""
    if occupied_by_file(store_dir):
        raise OpdiffError(f"the history store {store_dir} is a file, not a folder: point --store (or "
                          "[tool.opdiff] store) at the folder that holds runs/ (default ./store).")


@dataclass
class RunFile:
    """A parsed run file. `problems` names lines that were skipped (a truncated last
    line after a kill, or a corrupt line) as "line N: why"."""

    path: Path
    meta: dict[str, Any] | None
    items: list[dict[str, Any]]
    end: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)
    truncated: bool = False
    recovered: dict[str, Any] | None = None   # the last `recovered` line (storage/runs_remote.py)

    @property
    def complete(self) -> bool:
        return self.end is not None

    def keys(self) -> set[ItemKey]:
        return {k for k in map(item_key, self.items) if k is not None}


def item_key(item: Mapping[str, Any]) -> ItemKey | None:
    try:
        return (str(item["id"]), int(item["seed"]), str(item["preset"]))
    except (KeyError, TypeError, ValueError):
        return None


def parse_run(data: bytes, path: Path) -> RunFile:
    run = RunFile(path, None, [], None)
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    numbered = list(enumerate(lines, 1))
    if tail:
        numbered.append((len(lines) + 1, tail))
    for no, raw in numbered:
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            last = no == numbered[-1][0]
            if last:
                run.truncated = True
            run.problems.append(f"line {no}: {'truncated last line' if last else 'unreadable'} "
                                f"({exc.__class__.__name__}), skipped")
            continue
        kind = obj.get("type")
        if kind == "meta" and run.meta is None:
            run.meta = obj
        elif kind == "item":
            run.items.append(obj)
        elif kind == "end":
            run.end = obj
        elif kind == "recovered":
            run.recovered = obj
        else:
            run.problems.append(f"line {no}: unknown line type {kind!r}, skipped")
    return run


def read_run(path: Path) -> RunFile:
    """Parse a run file; a truncated last line is skipped and reported in `problems`."""
    path = Path(path)
    return parse_run(path.read_bytes(), path)


def readable_dir(store_dir: Path | str) -> Path:
    """A local folder holding the store's runs/: the store itself, or the synced mirror of a
    remote one."""
    return open_runs(store_dir).readable()


def _run_files(store_dir: Path | str) -> list[Path]:
    check_store_dir(store_dir)
    runs = readable_dir(store_dir) / RUNS_DIR
    return sorted(runs.glob("*.jsonl")) if runs.is_dir() else []


def last_line(path: Path, size: int = 65536) -> bytes:
    """The last line of a run file (its end line, when the run finished)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        n = f.tell()
        f.seek(max(0, n - size))
        chunk = f.read()
    return chunk.rstrip(b"\n").rsplit(b"\n", 1)[-1]


@dataclass
class RunSummary:
    run_id: str
    command: str | None
    started: str | None
    complete: bool
    counts: dict[str, int]
    path: Path
    resumable: bool = False       # what `check --resume` accepts: an interrupted check with its plan
    note: str = ""                # why an interrupted run is not resumable, and what to do
    meta: dict[str, Any] = field(default_factory=dict)   # its meta line
    run_group: str | None = None  # the logical run it belongs to (`--run-group`), e.g. one shard of N
    shard: str | None = None      # "K/N" for a shard
    recovered: dict[str, Any] | None = None   # its last lines came from a spool after it was interrupted
    finished: str | None = None   # its end line's time (UTC), for a complete run

    def seconds(self) -> float | None:
        """Wall seconds from its start to its end line (a resumed run: including the pause)."""
        try:
            return (_utc(self.finished) - _utc(self.started)).total_seconds()
        except (TypeError, ValueError):
            return None


def _utc(text: str | None) -> datetime:
    return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def resumability(meta: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether `check --resume` can finish an interrupted run with this meta line, and if
    not, what to do instead."""
    if meta.get("command") == "record":
        return False, "re-run `opdiff record`: it writes only the goldens still missing"
    if meta.get("runner") == "pytest":
        return False, "a pytest session (`pytest --opdiff`): run pytest again"
    if meta.get("command") != "check":
        return False, "not a run of opdiff check"
    if not isinstance(meta.get("plan"), dict):
        return False, "written without its plan (older opdiff-snap): start a new check"
    return True, ""


def tally(items: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for it in items:
        s = str(it.get("status"))
        counts[s] = counts.get(s, 0) + 1
    return counts


def list_runs(store_dir: Path | str) -> list[RunSummary]:
    """Every run in the store, oldest first. A complete run is summarised from its meta
    and end lines without reading its items; an incomplete one is tallied from them."""
    out = []
    for path in _run_files(store_dir):
        end = None
        try:
            last = json.loads(last_line(path))
            if isinstance(last, dict) and last.get("type") == "end":
                end = last
        except ValueError:
            pass
        if end is not None:
            with open(path, "rb") as f:
                try:
                    meta = json.loads(f.readline())
                except ValueError:
                    meta = {}
            counts, finished = dict(end.get("counts") or {}), end.get("finished")
            recovered = end.get("recovered") if isinstance(end.get("recovered"), dict) else None
        else:
            run = read_run(path)
            meta, counts, recovered, finished = run.meta or {}, tally(run.items), run.recovered, None
        resumable, note = (False, "") if end is not None else resumability(meta)
        meta = meta if isinstance(meta, dict) else {}
        out.append(RunSummary(path.stem, meta.get("command"), meta.get("started"), end is not None,
                              counts, path, resumable, note, meta, meta.get("run_group"), meta.get("shard"),
                              recovered, finished if isinstance(finished, str) else None))
    return out


@dataclass
class GroupSummary:
    """The runs of one `--run-group` taken as one logical run (the N shards of a check)."""

    run_group: str
    runs: list[RunSummary]
    counts: dict[str, int]
    complete: bool          # every run of the group has its end line, and every shard is there
    missing_shards: list[str]

    def shard_balance(self) -> tuple[float | None, float | None]:
        """The longest shard over the mean: as measured (each shard's wall time, once every
        shard has finished) and as the split expected it (None where unknown)."""
        shards = [r for r in self.runs if r.shard]
        plan = ((shards[0].meta.get("plan") or {}).get("shard") or {}) if shards else {}
        expected = over_mean([float(c) for c in plan.get("expected_ms") or []])
        seconds = [r.seconds() for r in shards]
        measured = over_mean([t for t in seconds if t is not None]) if self.complete and len(shards) > 1 \
            and None not in seconds else None
        return measured, expected


def over_mean(costs: Sequence[float]) -> float | None:
    """The largest of `costs` over their mean (1.0: perfectly even), None when all are 0."""
    total = sum(costs)
    return max(costs) / (total / len(costs)) if costs and total > 0 else None


def group_runs(runs: list[RunSummary]) -> list[GroupSummary]:
    groups: dict[str, list[RunSummary]] = {}
    for r in runs:
        if r.run_group:
            groups.setdefault(r.run_group, []).append(r)
    out = []
    for name, members in groups.items():
        counts: dict[str, int] = {}
        for r in members:
            for k, v in r.counts.items():
                counts[k] = counts.get(k, 0) + v
        shards = {r.shard for r in members if r.shard}
        total = {int(s.split("/")[1]) for s in shards if "/" in s}
        missing = [f"{k}/{n}" for n in total for k in range(1, n + 1) if f"{k}/{n}" not in shards]
        out.append(GroupSummary(name, members, counts, all(r.complete for r in members) and not missing,
                                missing))
    return out
