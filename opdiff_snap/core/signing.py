"""What a cache keeps, signed with a key of this user's that no cache holds: an entry
edited by anyone who can write to a cache folder (a cloned repository's `.opdiff-cache/`,
a shared folder) but not to this user's state folder is told apart from one this user's
opdiff-snap wrote.

The key lives in `$XDG_STATE_HOME/opdiff-snap/cache-key` (else `~/.local/state/...`): 32
random bytes, made on first use, a regular file of this user's readable by its owner alone.
A signed entry is the HMAC-SHA256 of its body in hex, a newline, then the body."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
import tempfile
from pathlib import Path

from .regular_files import read_regular

KEY_BYTES = 32
_MAC = 64   # hex digits of an HMAC-SHA256


def key_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "opdiff-snap" / "cache-key"


def _read_key(path: Path) -> bytes | None:
    """The key at `path`: a private regular file of this user's, of the right size; else None."""
    data = read_regular(path, KEY_BYTES, private=True)
    return data if data is not None and len(data) == KEY_BYTES else None


def _make_key(path: Path) -> None:
    """A new key at `path`, whole or not at all; one another process made first stays."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)   # made 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


@functools.lru_cache(maxsize=4)
def _key(path: Path) -> bytes | None:
    found = _read_key(path)
    if found is None and not os.path.lexists(path):
        try:
            _make_key(path)
        except OSError:
            return None
        found = _read_key(path)
    return found


def user_key() -> bytes | None:
    """This user's key (made on first use); None where it cannot be made, or what is there
    is not a private 32-byte file of this user's."""
    return _key(key_path())


def signed(key: bytes, body: bytes) -> bytes:
    """`body` with its signature in front."""
    return hmac.new(key, body, hashlib.sha256).hexdigest().encode() + b"\n" + body


def verified(key: bytes, data: bytes) -> bytes | None:
    """The body of `data` when its signature is `key`'s; None otherwise."""
    mac, body = data[:_MAC], data[_MAC + 1:]
    if data[_MAC:_MAC + 1] != b"\n":
        return None
    return body if hmac.compare_digest(hmac.new(key, body, hashlib.sha256).hexdigest().encode(), mac) else None
