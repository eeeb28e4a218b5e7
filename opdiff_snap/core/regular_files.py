"""Files a user names, of the right kind, read within a bound.

Every file opdiff reads or writes at a user's word (suites, option files, suite-cache
entries, summaries, reports) is a regular file, or absent for one it writes. A FIFO
would block the open or the read for ever, a device such as /dev/zero would be read
until memory runs out, a folder cannot be read at all: each is refused, naming the file
and the flag or purpose, before any work. Reads stop one byte past their bound.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import OpdiffError


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def not_regular(path: Path | str) -> str | None:
    """What `path` is when it exists and is not a regular file (links followed), else None."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def output_path(path: Path | str | None, flag: str) -> Path | None:
    """A file a command is about to write: absent or a regular file; anything else (a
    folder, a FIFO, a device) is refused naming `flag` before any work."""
    if path is None:
        return None
    what = not_regular(path)
    if what is not None:
        raise OpdiffError(f"{flag} {path} is {what}; give the path of a regular file to write.")
    return Path(path)


class NotRegularFile(OSError):
    """A path that is not a regular file, or a regular file larger than allowed."""


def read_bounded(path: Path | str, limit: int, what: str = "file", *, follow: bool = True,
                 cut: bool = False) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them. Opens without
    blocking (a FIFO), checks the open file is a regular one before reading, and reads at
    most limit + 1 bytes. `follow=False` refuses a symbolic link; `cut=True` returns the
    limit + 1 bytes of a larger file for the caller to judge. Raises OSError (a
    NotRegularFile for the wrong kind or size; its strerror says which)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFile(errno.ELOOP, f"the {what} is a symbolic link", str(path)) from None
        raise
    with open(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, f"the {what} is {_kind(mode)}, not a regular file", str(path))
        data = f.read(limit + 1)
    if len(data) > limit and not cut:
        raise NotRegularFile(errno.EFBIG, f"the {what} is larger than {limit:,} bytes, the most allowed",
                             str(path))
    return data


def read_text_bounded(path: Path | str, limit: int, what: str, where: str) -> str:
    """`read_bounded` as UTF-8 text; any failure is an OpdiffError starting with `where`
    (the flag and the path) that says what to do."""
    try:
        return read_bounded(path, limit, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OpdiffError(f"{where}: cannot read it as UTF-8 text (byte offset {exc.start} is not "
                          "UTF-8); save it as UTF-8.") from None
    except OSError as exc:
        raise OpdiffError(f"{where}: cannot read it ({exc.strerror or exc}); give a regular file.") from None


def read_regular(path: Path | str, limit: int, *, private: bool = False) -> bytes | None:
    """The bytes of the regular file at `path` when it holds at most `limit` of them; None
    for anything else (missing, unreadable, a link, pipe, device or folder, too big). With
    `private`, only a file of this user's that nobody else may read or write."""
    try:
        if private:
            st = os.lstat(path)
            ours = not hasattr(os, "getuid") or st.st_uid == os.getuid()
            if not ours or st.st_mode & 0o077:
                return None
        return read_bounded(path, limit, follow=False)
    except (OSError, ValueError):
        return None
