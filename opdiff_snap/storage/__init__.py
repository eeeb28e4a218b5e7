"""Where stores live: a local folder or a prefix in an S3-compatible bucket, behind one
small interface (`Place`). The golden store, the history store and the artifact cache are
written against it; `open_place` picks the implementation from the location."""

from .base import Entry, ObjectTooLarge, Place, StorageError, Stray, is_url, local_copy_dir
from .open import open_place

__all__ = ["Entry", "ObjectTooLarge", "Place", "StorageError", "Stray", "is_url", "local_copy_dir",
           "open_place"]
