"""Where stores live: a local folder or a prefix in an S3-compatible bucket, behind one
small interface (`Place`), and on it one seam per store: the golden store reads its units
through `units`, the history its run files through `runs` (`open_runs`), the artifact
cache its folders through `shared` (`open_tiers`). Only this package acts on whether a
location is local or a URL (`open.py` picks the implementations; core/locations.py reads
a location as given)."""

from .open import local_folder, open_place, open_runs, open_tiers
from .place import Entry, ObjectTooLarge, Place, StorageError, Stray, is_url, local_copy_dir, occupied_by_file

__all__ = ["Entry", "ObjectTooLarge", "Place", "StorageError", "Stray", "is_url", "local_copy_dir",
           "local_folder", "occupied_by_file", "open_place", "open_runs", "open_tiers"]
