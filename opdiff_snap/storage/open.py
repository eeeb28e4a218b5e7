"""Open a store location: a local path or an s3:// URL."""

from __future__ import annotations

from pathlib import Path

from .base import Place, is_url


def open_place(location: str | Path) -> Place:
    if is_url(location):
        from .s3 import S3Place

        return S3Place(str(location))
    from .local import LocalPlace

    return LocalPlace(Path(location))
