"""The Zarr golden store: Golden <-> goldens/ (layout: docs/goldens-layout.md)."""

from .keys import store_key
from .model import CorruptGolden, Golden, GoldenInfo, MissingGolden
from .store import Finding, GoldenStore, GoldenWriteError

__all__ = ["CorruptGolden", "Finding", "Golden", "GoldenInfo", "GoldenStore", "GoldenWriteError", "MissingGolden",
           "store_key"]
