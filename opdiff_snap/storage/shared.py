"""A local folder of units that its users load from directly, with, for a location behind a
URL, a shared place behind it: the seam the artifact cache is written against.

`open_tiers(location)` (open.py): for a local path, the folder itself (`Tiers`, nothing shared); for
an s3:// URL, a local folder for it (local_copy_dir, `artifacts`) in front of the bucket
(`SharedTiers`). A unit missing locally is fetched whole from the shared place (its objects,
then the marker, published locally by rename); one published locally is shared (its files
first, the marker last). A shared place that fails only costs the sharing: a fetch finds
nothing, a share or a drop is skipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .local import LocalPlace
from .place import StorageError, local_copy_dir
from .s3 import S3Place


class Tiers:
    """A local folder of units, shared with nobody."""

    def __init__(self, root: Path):
        self.local = LocalPlace(root)
        self.root = self.local.root

    def probe(self) -> None:
        """Raise StorageError unless the shared place, if there is one, can be written."""

    def fetch(self, name: str, marker: str) -> bool:
        """Bring the shared place's complete unit `name` into the local folder; False when
        there is none (or it could not be brought)."""
        return False

    def share(self, name: str, marker: str) -> None:
        """Copy the local unit `name` into the shared place, unless it is there already."""

    def drop(self, name: str, marker: str) -> None:
        """Remove unit `name` from the shared place."""


class SharedTiers(Tiers):
    """A local folder in front of the shared place at `url`."""

    def __init__(self, url: str):
        self.shared = S3Place(url)
        super().__init__(local_copy_dir(url, "artifacts"))

    def probe(self) -> None:
        self.shared.probe()

    def fetch(self, name: str, marker: str) -> bool:
        try:
            objects = [e.key for e in self.shared.list(name)]
            if f"{name}/{marker}" not in objects:
                return False
            staging = self.local.stage(name)
            try:
                for obj in objects:
                    rel = obj[len(name) + 1:]
                    if rel != marker:
                        self.shared.download(obj, staging / rel)
                (staging / marker).write_text("")
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            self.local.publish_dir(name, staging)   # False: another process brought it first
            return True
        except (StorageError, OSError):
            return False

    def share(self, name: str, marker: str) -> None:
        path = self.local.path(name)
        try:
            if self.shared.exists(f"{name}/{marker}"):
                return
            objects = {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
                       if p.is_file() and p.name != marker}
            self.shared.publish(name, {**objects, marker: b""}, marker)   # data first, the marker last
        except (StorageError, OSError):
            pass   # the unit is here all the same; another user of the shared place makes its own

    def drop(self, name: str, marker: str) -> None:
        try:
            self.shared.remove(name, marker)
        except StorageError:
            pass
