"""The Zarr golden store: Golden <-> goldens/ (layout: docs/goldens-layout.md)."""

from .keys import store_key
from .model import CorruptGolden, Golden, GoldenInfo, MissingGolden
from .store import GoldenStore

__all__ = ["CorruptGolden", "Golden", "GoldenInfo", "GoldenStore", "MissingGolden", "store_key"]
