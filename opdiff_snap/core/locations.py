"""A store location as given in a flag or a setting: a local path, or an s3:// URL kept as
a string. The stores act on the difference (storage/); this is where it is told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import OpdiffError

SCHEMES = ("s3://",)


def is_url(location: object) -> bool:
    """Whether a store location is a URL (s3://bucket/prefix) rather than a local path."""
    return isinstance(location, str) and location.startswith(SCHEMES)


def parse_location(value: Any) -> Path | str:
    """A store location as given (a flag, a setting): an s3:// URL stays a string, anything
    else is a path."""
    text = str(value)
    if is_url(text):
        return text.rstrip("/")
    if "://" in text:
        raise OpdiffError(f"'{text}': only local paths and s3://bucket/prefix URLs are supported as "
                          "store locations.")
    return Path(value)
