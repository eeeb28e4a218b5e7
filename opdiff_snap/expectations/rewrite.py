"""`--update-expectations` writing the file: a file that is read-only is refused, nothing
changed; the new text goes into a fresh temporary file beside it, created exclusively (a
link or file planted under any name is never opened), given the file's mode, renamed over
it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from ..core.errors import OpdiffError


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
