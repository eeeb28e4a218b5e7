"""Reading a file only when it is a regular file, and only up to a bound: a symbolic link
is never followed, a pipe never waited on, a device or a growing file never read past
the bound."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_regular(path: Path | str, limit: int, *, private: bool = False) -> bytes | None:
    """The bytes of the regular file at `path` when it holds at most `limit` of them; None
    for anything else (missing, unreadable, a link, pipe, device or folder, too big). With
    `private`, only a file of this user's that nobody else may read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            ours = not hasattr(os, "getuid") or st.st_uid == os.getuid()
            if not stat.S_ISREG(st.st_mode) or st.st_size > limit or (private and (not ours or st.st_mode & 0o077)):
                return None
            data = f.read(limit + 1)
        except OSError:
            return None
    return data if len(data) <= limit else None
