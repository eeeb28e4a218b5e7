"""Open a store location, a local path or an s3:// URL: as a place (`open_place`), as a
history store (`open_runs`), or as a cache's folders (`open_tiers`). Where the kind of a
location is looked at: the stores are written against what these return."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import OpdiffError
from .place import Place, is_url
from .run_store import LocalRuns, Runs
from .shared import Tiers


def open_place(location: str | Path) -> Place:
    if is_url(location):
        from .s3 import S3Place

        return S3Place(str(location))
    from .local import LocalPlace

    return LocalPlace(Path(location))


def open_runs(location: Path | str) -> Runs:
    """The runs of the history store at `location` (runs.py)."""
    if is_url(location):
        from .runs_remote import RemoteRuns

        return RemoteRuns(str(location))
    return LocalRuns(Path(location))


def open_tiers(location: Path | str) -> Tiers:
    """The local folder for the cache at `location`, and the shared place behind it if it is
    a URL (shared.py)."""
    if is_url(location):
        from .shared import SharedTiers

        return SharedTiers(str(location))
    return Tiers(Path(location))


def local_folder(location: Path | str, what: str, why: str) -> Path:
    """`location` as a local folder, for a use that needs one (`what` is the flag, `why`
    says what needs it); a URL is refused with one paragraph."""
    if is_url(location):
        raise OpdiffError(f"{why}, and {what} is {location}; give a local folder. Nothing was done.")
    return Path(location)
