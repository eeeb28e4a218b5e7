"""`--update-expectations` writing the file: a file that is read-only is refused, nothing
changed."""

from __future__ import annotations

import os
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
