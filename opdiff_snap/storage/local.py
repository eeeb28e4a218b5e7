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
import errno
import os
import shutil
import stat
import tempfile
import time
import uuid
from pathlib import Path
from typing import Mapping

from .place import Entry, ObjectTooLarge, Place, Stray

STAGING, TRASH = ".staging", ".trash"


class LocalPlace(Place):
    remote = False
    bookkeeping = (STAGING, TRASH)

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.location = self.root
        self.url = str(self.root)

    def path(self, key: str = "") -> Path:
        return self.root / key if key else self.root

    def where(self, key: str = "") -> str:
        return str(self.path(key))

    # ------------------------------------------------------------ objects

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """Only a regular file is an object: a symbolic link (wherever it points), a
        folder, a pipe or a device raises an OSError instead of being followed, blocking
        or read forever."""
        path = self.path(key)
        try:   # a pipe must not block the open
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, "is a symbolic link, which the store never follows", str(path)) from None
            raise
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            if max_bytes is not None and st.st_size > max_bytes:
                raise ObjectTooLarge(errno.EFBIG, f"holds {st.st_size} bytes, more than the {max_bytes} expected",
                                     str(path))
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:   # it grew while being read
            raise ObjectTooLarge(errno.EFBIG, f"holds more than the {max_bytes} bytes expected", str(path))
        return data

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

    def probe_key(self) -> str:
        return f"{STAGING}/{unique('probe')}"

    def zarr_array(self, key: str):
        import zarr

        return zarr.open_array(str(self.path(key)), mode="r")

    def download(self, key: str, path: Path) -> None:
        shutil.copyfile(self.path(key), path)

    # ------------------------------------------------------------ units

    def unit_exists(self, name: str, marker: str) -> bool:
        path = self.root / name
        return path.is_dir() and not path.is_symlink()

    def survey(self, marker: str, keep: tuple[str, ...] = ()) -> "tuple[builtins.list[str], builtins.list[Stray]]":
        """Every folder that is not debris is a unit: a folder without its marker is damage
        here (units appear by rename), which the caller reports. A file, a symbolic link (to
        a folder or not) or anything else at the top is a stray, never a unit."""
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return [], []
        units, strays = [], []
        for e in entries:
            if e.name.startswith(".") or e.name in keep:
                continue
            if e.is_symlink():
                try:
                    target = os.readlink(e.path)
                except OSError:
                    target = "?"
                strays.append(Stray(e.name, f"a symbolic link to {target}"))
            elif e.is_dir(follow_symlinks=False):
                units.append(e.name)
            elif e.is_file(follow_symlinks=False):
                strays.append(Stray(e.name, "a file"))
            else:
                strays.append(Stray(e.name, "neither a file nor a folder (a pipe, socket or device)"))
        return units, strays

    def publish(self, name: str, objects: Mapping[str, bytes], marker: str, *, fresh: bool = False) -> None:
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

    def stage(self, name: str) -> Path:
        """A new empty folder beside where unit `name` goes, to build it in and then move it
        into place with `publish_dir` (its `.staging-` name marks it as debris meanwhile)."""
        final = self.path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".staging-{final.name[:12]}-", dir=final.parent))

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
                if not os.path.lexists(final):   # a dangling symbolic link is in the way too
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
                _discard(trash)
            return
        raise OSError(f"could not move {name} into {self.root} after 20 tries")

    def remove(self, name: str, marker: str) -> None:
        trash = self.root / TRASH / unique(name.replace("/", "_"))
        (self.root / TRASH).mkdir(parents=True, exist_ok=True)
        try:
            os.rename(self.root / name, trash)
        except FileNotFoundError:
            return
        _discard(trash)

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


def _discard(path: Path) -> None:
    """Delete a folder with what it holds, or a file or symbolic link (never what a link
    points to)."""
    if path.is_symlink() or not path.is_dir():
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass   # debris: removed later by clean_debris
    else:
        shutil.rmtree(path, ignore_errors=True)


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


def write_json_whole(path: Path, value: object) -> bool:
    """`value` as JSON at `path`, written whole or not at all (a temporary file beside it,
    renamed into place); False, and nothing left behind, where it could not be written.
    For caches, whose entries only save the next run some work."""
    import json

    try:
        data = json.dumps(value, separators=(",", ":"), allow_nan=True).encode()
    except (ValueError, TypeError, RecursionError):
        return False
    return write_bytes_whole(path, data)


def write_bytes_whole(path: Path, data: bytes) -> bool:
    """`data` at `path`, written whole or not at all, as write_json_whole writes."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
