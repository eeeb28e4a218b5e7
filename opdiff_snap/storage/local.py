"""A place on a local disk: objects are files, units are folders.

A unit is built in `<root>/.staging/<name>.<pid>.<random>/` and renamed into place, so a
reader sees a whole unit or none, and a writer killed at any point leaves at most debris
under `.staging/` (ignored, removed once its writer is gone). Replacing a unit renames the
old one into `<root>/.trash/` first, renames the new one in, then deletes the old. A write
that fails (disk full, read-only) removes its staging and raises the OSError; units already
in place are never touched by a failed write. Nothing is fsynced: the place survives killed
processes, not power loss mid-write.
"""

from __future__ import annotations

import builtins
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Mapping

from .base import Entry, Place

STAGING, TRASH = ".staging", ".trash"


class LocalPlace(Place):
    remote = False

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.url = str(self.root)

    def path(self, key: str = "") -> Path:
        return self.root / key if key else self.root

    def where(self, key: str = "") -> str:
        return str(self.path(key))

    # ------------------------------------------------------------ objects

    def get(self, key: str) -> bytes:
        with open(self.path(key), "rb") as f:
            return f.read()

    def put(self, key: str, data: bytes, *, create: bool = False) -> bool:
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{unique('tmp')}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            if create:
                try:
                    os.link(tmp, final)      # fails when something is there: create-only, whole
                except FileExistsError:
                    return False
                except OSError:              # a file system without hard links
                    if final.exists():
                        return False
                    os.replace(tmp, final)
                return True
            os.replace(tmp, final)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[Entry]:
        base = self.path(prefix)
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                p = Path(dirpath) / name
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                out.append(Entry(p.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return sorted(out, key=lambda e: e.key)

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def download(self, key: str, path: Path) -> None:
        shutil.copyfile(self.path(key), path)

    # ------------------------------------------------------------ units

    def units(self, marker: str) -> "builtins.list[str]":
        """Every folder that is not debris: a folder without its marker is damage here (units
        appear by rename), which the caller reports."""
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        return [e.name for e in entries if not e.name.startswith(".") and e.is_dir()]

    def unit_exists(self, name: str, marker: str) -> bool:
        return (self.root / name).is_dir()

    def publish(self, name: str, objects: Mapping[str, bytes], marker: str) -> None:
        stage = self.root / STAGING / unique(name)
        stage.parent.mkdir(parents=True, exist_ok=True)
        stage.mkdir()
        try:
            for key in sorted(objects, key=lambda k: k == marker):   # the marker last
                target = stage / key
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    f.write(objects[key])
            self._move_in(stage, name)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise

    def publish_dir(self, name: str, stage: Path) -> bool:
        """Rename a folder built elsewhere on this disk into place as unit `name`, unless one
        is there already (then `stage` is removed and False returned)."""
        final = self.root / name
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(stage, final)
            return True
        except OSError:
            shutil.rmtree(stage, ignore_errors=True)
            if not final.exists():
                raise
            return False

    def _move_in(self, stage: Path, name: str) -> None:
        final = self.root / name
        for _ in range(20):
            try:
                os.rename(stage, final)
                return
            except OSError:
                if not final.exists():
                    raise
            trash = self.root / TRASH / unique(name)
            trash.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                continue  # another writer moved it first; try again
            try:
                os.rename(stage, final)
            finally:
                shutil.rmtree(trash, ignore_errors=True)
            return
        raise OSError(f"could not move {name} into {self.root} after 20 tries")

    def remove(self, name: str, marker: str) -> None:
        trash = self.root / TRASH / unique(name.replace("/", "_"))
        (self.root / TRASH).mkdir(parents=True, exist_ok=True)
        try:
            os.rename(self.root / name, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def clean_debris(self, max_age_s: float, marker: str = "", keep: tuple[str, ...] = ()) -> int:
        """Remove staging and trash left by writers that died (their process is gone on this
        host, or the debris is older than `max_age_s`); names in `keep` stay."""
        removed = 0
        now = time.time()
        for sub in (STAGING, TRASH):
            try:
                entries = list(os.scandir(self.root / sub))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name in keep or any(entry.name.startswith(f".{k}.") for k in keep):
                    continue
                pid = pid_of(entry.name)
                try:
                    old = now - entry.stat(follow_symlinks=False).st_mtime > max_age_s
                except FileNotFoundError:
                    continue
                if old or (pid is not None and not alive(pid)):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        Path(entry.path).unlink(missing_ok=True)
                    removed += 1
        return removed


def unique(prefix: str) -> str:
    return f"{prefix}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def pid_of(name: str) -> int | None:
    parts = name.rsplit(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
