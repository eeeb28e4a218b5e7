"""The Zarr golden store: Golden <-> goldens/ (layout: docs/goldens-layout.md)."""

from .golden import CorruptGolden, Golden, GoldenInfo, MissingGolden
from .keys import key_of_unknown, store_key, unknown_entry
from .store import Finding, GoldenStore, GoldenWriteError

__all__ = ["CorruptGolden", "Finding", "Golden", "GoldenInfo", "GoldenStore", "GoldenWriteError", "MissingGolden",
           "key_of_unknown", "store_key", "unknown_entry"]
