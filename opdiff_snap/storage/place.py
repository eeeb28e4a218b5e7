"""The storage seam: a place holding objects (bytes under `/`-separated keys).

Besides plain objects (`get`, `put`, `delete`, `list`), a place holds *units*: a group of
objects under one top-level name that appears to readers whole or not at all. A unit is
visible once its marker object (a golden's `zarr.json`, a cache entry's `complete`) is
there: a local folder publishes a unit by building it aside and renaming it into place,
an object store (which has no rename) writes the marker object last and deletes it
first, so readers skip a unit whose marker is missing. Whatever else sits at the top of
a place (a file, a symbolic link, an object outside any unit) is a `Stray`, which
`survey` names so that the store can report it instead of skipping it.
"""

from __future__ import annotations

import builtins
import hashlib
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..core.errors import OpdiffError
from ..core.locations import is_url


class StorageError(OpdiffError):
    """A store behind a URL could not be reached, refused the credentials, or has no such
    bucket. The message names the URL and what to do, never a credential."""


def occupied_by_file(location: Path | str) -> bool:
    """Whether a local store location is taken by something other than a folder (a file),
    so that nothing can be stored there. A URL never is."""
    if is_url(location):
        return False
    path = Path(location)
    return path.exists() and not path.is_dir()


@dataclass(frozen=True)
class Entry:
    key: str          # relative to the place
    size: int
    mtime: float      # seconds since the epoch


@dataclass(frozen=True)
class Stray:
    """A top-level entry of a place that is not a unit: `what` says what it is instead
    ("a file", "a symbolic link to /elsewhere", ...)."""

    name: str
    what: str


class ObjectTooLarge(OSError):
    """An object holds more bytes than the reader asked for at most (`get(max_bytes=...)`);
    none of them were read."""


class Place(ABC):
    """A folder-like place holding objects. Keys are relative, `/`-separated."""

    url: str                  # how messages name it (never with credentials)
    location: Path | str      # the location as it was given: a local path, or the URL
    remote: bool = False
    bookkeeping: tuple[str, ...] = ()   # top-level folders the place keeps for itself (".staging")

    # ------------------------------------------------------------ objects

    @abstractmethod
    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        """The object's bytes; raises FileNotFoundError when there is none. With
        `max_bytes`, an object larger than that raises ObjectTooLarge before its bytes are
        read (a reader that knows the size to expect never loads more)."""

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Several objects at once (None for a missing one)."""
        out: dict[str, bytes | None] = {}
        for key in keys:
            try:
                out[key] = self.get(key)
            except FileNotFoundError:
                out[key] = None
        return out

    @abstractmethod
    def put(self, key: str, data: bytes, *, create: bool = False) -> bool:
        """Store `data` under `key`, whole (readers never see part of it). With `create`,
        only when nothing is there yet: returns False (and writes nothing) otherwise."""

    def put_many(self, objects: Mapping[str, bytes]) -> None:
        for key, data in objects.items():
            self.put(key, data)

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; a missing one is fine."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[Entry]:
        """Every object under `prefix` (a folder-like prefix, `a/b`), recursively."""

    def exists(self, key: str) -> bool:
        try:
            self.get(key)
        except FileNotFoundError:
            return False
        return True

    def download(self, key: str, path: Path) -> None:
        """Copy an object into a local file (written aside and renamed into place)."""
        data = self.get(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def upload(self, path: Path, key: str, *, create: bool = False) -> bool:
        return self.put(key, Path(path).read_bytes(), create=create)

    # ------------------------------------------------------------ units

    @abstractmethod
    def unit_exists(self, name: str, marker: str) -> bool: ...

    @abstractmethod
    def survey(self, marker: str, keep: tuple[str, ...] = ()) -> "tuple[builtins.list[str], builtins.list[Stray]]":
        """(the units readers may look at, the strays) at the top of this place, from one
        listing. Names starting with "." (the place's own bookkeeping) and the names in
        `keep` are neither."""

    @abstractmethod
    def publish(self, name: str, objects: Mapping[str, bytes], marker: str, *, fresh: bool = False) -> None:
        """Make unit `name` hold exactly `objects` (`marker` among them), replacing any unit
        of that name; readers see the old unit, none, or the new one, never a mix. `fresh`:
        the caller saw no unit of that name, which may save the place some work (it must
        still be right when one appeared meanwhile)."""

    @abstractmethod
    def remove(self, name: str, marker: str) -> None:
        """Delete a unit (it disappears for readers first); a missing one is fine."""

    def probe(self) -> None:
        """Write a small object and delete it again: raises (OSError, StorageError) unless
        this place can be written."""
        key = self.probe_key()
        self.put(key, b"")
        self.delete(key)

    @abstractmethod
    def probe_key(self) -> str:
        """A new key for `probe`, where readers of the place never look."""

    @abstractmethod
    def zarr_array(self, key: str):
        """The zarr array stored under `key`, opened read-only with zarr itself."""

    def clean_debris(self, max_age_s: float, marker: str = "", keep: tuple[str, ...] = ()) -> int:
        """Remove what writers that died left behind (older than `max_age_s`, or whose
        process is gone); names in `keep` stay. Returns how many entries went."""
        return 0

    def where(self, key: str = "") -> str:
        """How messages name an object of this place."""
        return f"{self.url.rstrip('/')}/{key}" if key else self.url


def cache_home() -> Path:
    """The folder for local copies of remote stores: $OPDIFF_CACHE_HOME, else
    $XDG_CACHE_HOME/opdiff-snap, else ~/.cache/opdiff-snap."""
    if os.environ.get("OPDIFF_CACHE_HOME"):
        return Path(os.environ["OPDIFF_CACHE_HOME"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "opdiff-snap"


def local_copy_dir(url: str, kind: str) -> Path:
    """A local folder for what this machine keeps of the store at `url`: `kind` is
    `artifacts` (the cache's local tier), `spool` (runs being written) or `mirror` (the
    history as last synced). One folder per URL (and endpoint)."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    digest = hashlib.sha256(f"{endpoint}\0{url}".encode()).hexdigest()[:16]
    return cache_home() / kind / digest
