"""The units of a place and their marker objects (a golden's `zarr.json`), read as cheaply
as the place allows: the seam the golden store reads its goldens' metadata through.

On a local disk a read is cheap and always current, so every question goes to the disk
(`Units`): a unit is there when its folder is (units appear by rename, so a folder without
its marker is damage, which the caller reports). On an object store every read is a round
trip, so the units are listed once and their markers read in one batch, then kept
(`ListedUnits`): a unit is there when its marker is (a unit without it is being written,
or its writer died), and a kept marker may be stale once another writer replaced the unit,
which `forget` lets the caller recover from.
"""

from __future__ import annotations

from .place import Place, Stray


class UnitMissing(FileNotFoundError):
    """There is no such unit (as opposed to a unit whose marker is missing)."""


class Units:
    """The units of `place` marked by `marker`; `keep` names top-level entries of the place's
    own that are neither units nor strays."""

    def __init__(self, place: Place, marker: str, keep: tuple[str, ...] = ()):
        self.place, self.marker, self.keep = place, marker, keep

    def survey(self) -> tuple[list[str], list[Stray]]:
        """(the units, the strays) at the top of the place (Place.survey)."""
        return self.place.survey(self.marker, keep=self.keep)

    def listed(self) -> None:
        """Make sure the units have been surveyed when that makes later questions cheaper."""

    def present(self, name: str) -> bool:
        return self.place.unit_exists(name, self.marker)

    def marker_of(self, name: str) -> bytes:
        """The marker object's bytes. Raises UnitMissing when there is no unit `name`, and
        FileNotFoundError when the unit is there without its marker."""
        if not self.place.unit_exists(name, self.marker):
            raise UnitMissing(self.place.where(name))
        return self.place.get(f"{name}/{self.marker}")

    def seen_absent(self, name: str) -> bool:
        """Whether a listing kept from earlier had no unit `name` (asks the place nothing;
        another writer may have made one since)."""
        return False

    def forget(self, name: str) -> bool:
        """Drop what is kept of unit `name`; True when something was (a read of it may have
        used a stale marker, and is worth one more try)."""
        return False

    def published(self, name: str, marker: bytes) -> None:
        """Unit `name` was just published with this marker."""

    def removed(self, name: str) -> None:
        """Unit `name` was just removed."""


class ListedUnits(Units):
    """Units listed once, their markers read in one batch and kept."""

    def __init__(self, place: Place, marker: str, keep: tuple[str, ...] = ()):
        super().__init__(place, marker, keep)
        self._markers: dict[str, bytes] = {}
        self._listed: set[str] | None = None

    def survey(self) -> tuple[list[str], list[Stray]]:
        names, strays = super().survey()
        fetched = self.place.get_many(f"{n}/{self.marker}" for n in names if n not in self._markers)
        self._markers.update({k.rsplit("/", 1)[0]: v for k, v in fetched.items() if v is not None})
        self._listed = set(names)
        return names, strays

    def listed(self) -> None:
        if self._listed is None:
            self.survey()   # one listing and a batch of reads instead of two requests per unit

    def present(self, name: str) -> bool:
        if self._listed is not None:
            return name in self._listed
        return super().present(name)

    def marker_of(self, name: str) -> bytes:
        kept = self._markers.get(name)
        if kept is not None:
            return kept
        try:
            return self.place.get(f"{name}/{self.marker}")
        except FileNotFoundError as exc:   # not (or not yet) a whole unit: none
            raise UnitMissing(*exc.args) from None

    def seen_absent(self, name: str) -> bool:
        return self._listed is not None and name not in self._listed

    def forget(self, name: str) -> bool:
        return self._markers.pop(name, None) is not None

    def published(self, name: str, marker: bytes) -> None:
        self._markers[name] = marker
        if self._listed is not None:
            self._listed.add(name)

    def removed(self, name: str) -> None:
        self._markers.pop(name, None)
        if self._listed is not None:
            self._listed.discard(name)


def open_units(place: Place, marker: str, keep: tuple[str, ...] = ()) -> Units:
    """The units of `place`, read the way that suits it (see the module's text)."""
    return (ListedUnits if place.remote else Units)(place, marker, keep)
