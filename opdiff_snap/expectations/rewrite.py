"""`--update-expectations` writing the file: a file that is read-only is refused, nothing
changed. Two updates at once lose nothing: each holds the folder's lock while it reads
the file again, applies its own run to what it reads, and writes; the new text goes into a
fresh temporary file beside it, created exclusively (a link or file planted under any name
is never opened), given the file's mode, renamed over it."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..compare.results import Result
from ..core.errors import OpdiffError
from ..core.verdicts import Verdict
from ..suite.yamlload import read_yaml_bytes
from .entries import Expectations
from .file import digest, dump, load
from .update import Changes, update


def rewrite(path: Path, results: Sequence[Result], failing: Iterable[Verdict], presets: list[str],
            loaded: Expectations | None = None) -> Changes:
    """Make the file `path` agree with the run `results`, as it is now (another update
    may have written it since this run read it as `loaded`), under the folder's lock; what
    changed. Raises OpdiffError (read-only, or the file as it is now is malformed), OSError."""
    with _locked(path.parent):
        refuse_read_only(path)
        after, changes = update(_as_now(path, presets, loaded), results, failing)
        if changes:
            write_whole(path, dump(after))
    return changes


def _as_now(path: Path, presets: list[str], loaded: Expectations | None) -> Expectations:
    """The file's expectations as it is now: `loaded` where its text is unchanged (no
    second validation of a large file), else read again."""
    if not os.path.lexists(path):
        return Expectations([], str(path))
    if loaded is not None and loaded.digest:
        with contextlib.suppress(OSError):
            if digest(read_yaml_bytes(path)) == loaded.digest:
                return loaded
    return load(path, presets)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The exclusive lock of `folder` (flock on the folder itself: no lock file to plant
    a link as, or to leave behind), held inside; where there are no file locks, none."""
    try:
        import fcntl
    except ImportError:   # not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        with contextlib.suppress(OSError):   # a file system without locks: unguarded
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # releases the lock


def refuse_read_only(path: Path) -> None:
    """Raise OpdiffError where `path` exists and is read-only (no write permission bit, or
    not writable by this user): its owner means it to stay as it is, so it is not replaced
    (a rename would, whatever its mode)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OpdiffError(f"--update-expectations: cannot read the expectations file {path} ({exc.strerror or exc})"
                          "; nothing was changed.") from None
    if not mode & 0o222 or not os.access(path, os.W_OK):
        raise OpdiffError(f"--update-expectations: the expectations file {path} is read-only, so it is left as it "
                          f"is. Make it writable (chmod u+w {path}) to update it, or run without "
                          "--update-expectations; nothing was changed.")


def write_whole(path: Path, text: str) -> None:
    """`text` as the file `path`, whole or not at all, keeping its mode (a new file gets
    the umask's). Raises OSError, leaving nothing behind."""
    try:
        mode: int | None = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    fd, tmp = _fresh(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _fresh(path: Path) -> tuple[int, Path]:
    """A new file beside `path` under a name no one chose before (O_EXCL: never a link or
    a file that was there), open for writing."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no fresh temporary name beside {path}")
