"""Store keys: one safe, flat directory name per (test id, seed).

`<sanitised lowercase prefix>-<16 hex of sha256(exact id)>-s<seed>`: no `/` nesting, no
`..`, no leading dot or dash, and ids differing only in case (or in characters the
prefix drops) still get different keys through the hash of the exact id. The exact id
is kept in the golden's attributes.
"""

from __future__ import annotations

import hashlib
import re

from ..core.safetext import printable

_UNSAFE = re.compile(r"[^a-z0-9_-]+")
KEY_PATTERN = re.compile(r"^[a-z0-9_-]*-[0-9a-f]{16}-s-?[0-9]+$")
PREFIX_CHARS = 48


def store_key(test_id: str, seed: int) -> str:
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"a golden's seed must be an int, got {seed!r}")
    prefix = _UNSAFE.sub("_", test_id.lower())[:PREFIX_CHARS].strip("_-") or "test"
    digest = hashlib.sha256(test_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{prefix}-{digest}-s{seed}"


def seed_of_key(key: str) -> int | None:
    """The seed a key names, or None for a name that is not a golden key."""
    if not KEY_PATTERN.match(key):
        return None
    return int(key.rsplit("-s", 1)[1])


_UNKNOWN = "<unknown: "


def unknown_entry(key: str) -> str:
    """The name results give an entry of the store whose test cannot be told (no
    readable id, or an id that does not belong under its key): the key itself."""
    return f"{_UNKNOWN}{printable(key)}>"


def key_of_unknown(name: str) -> str | None:
    """The key an `unknown_entry` name was made from; None for a test id (ids hold no
    spaces, so none looks like one)."""
    return name[len(_UNKNOWN):-1] if name.startswith(_UNKNOWN) and name.endswith(">") else None
