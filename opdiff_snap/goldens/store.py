"""GoldenStore: a Zarr v3 group, one child array per (test id, seed), in a local folder or
behind an s3:// URL (storage.Place).

Writes are atomic per golden: each golden is a unit of its place, published whole (see
storage/place.py). On a local disk it is built in `<root>/.staging/` and renamed into place;
overwriting renames the old golden into `<root>/.trash/` first. On an object store, which
has no rename, its data objects are written first and its `zarr.json` last, and readers
ignore a golden whose `zarr.json` is missing. A write that fails (disk full, read-only
store, an unreachable service) raises GoldenWriteError; goldens already in place are never
touched by a failed write (on an object store, one being replaced is invisible until its
new version is complete).

`write_later` hands a golden's publishing to a few threads when the store is remote, so a
run's goldens travel to the service together instead of one round trip after another; a
local write is done before it returns (a rename costs less than a thread hand-off).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection

from ..core.errors import OpdiffError
from ..core.safetext import printable, unsafe_char
from ..core.verdicts import GoldenState
from ..storage import StorageError, Stray, occupied_by_file, open_place
from ..storage.units import UnitMissing, open_units
from .encode import FORMAT, MARK, decode, encode, info_from_attrs, tensor_records
from .golden import CorruptGolden, Golden, GoldenInfo, MissingGolden
from .keys import seed_of_key, store_key, unknown_entry
from .ledger import LEDGER, BaselineFailure, Ledger
from .packed import META, PackError, array_metadata, pack, packed_objects, parse_metadata, read_data, unpack
from .packs import PackEntry, Packs, is_pack
from .validate import definition_findings
from .validate import problems as metadata_problems

ROOT_ATTRS = {"opdiff_snap_goldens": {"format": FORMAT, "layout": "docs/goldens-layout.md"}}
DEBRIS_MAX_AGE_S = 3600.0
WRITE_THREADS = 16                  # goldens written into a remote store at once
WRITES_OUTSTANDING = 2 * WRITE_THREADS   # handed over and not yet written, at most (bounds the memory held)


class GoldenWriteError(OpdiffError):
    """The store could not be written (disk full, read-only, not a folder, an unreachable
    service); what was already recorded is untouched."""


@dataclass(frozen=True)
class Finding:
    """One thing verification says about one golden: `kind` is CORRUPT (check will not
    compare it), STALE (its spec hash does not match its definition and modules as they
    are now) or UNCHECKED (its spec hash could not be checked from here)."""

    info: GoldenInfo
    kind: GoldenState
    message: str


class GoldenStore:
    def __init__(self, root: Path | str):
        self._ready = False
        if occupied_by_file(root):
            raise OpdiffError(f"the golden store {root} is a file, not a folder: point --goldens "
                              "(or [tool.opdiff] goldens) at the folder that holds the goldens "
                              "(default ./goldens).")
        self.place = open_place(root)
        self.root: Path | str = self.place.location
        # the goldens and their zarr.json, read as the place suits (a remote store: in one batch)
        self.units = open_units(self.place, META, keep=(META,))
        # goldens packed many to a unit (goldens/packs.py); a loose golden of the same key wins
        self.packs = Packs(self.place, self.units.marker_of)
        self.ledger = Ledger(self.place)
        self._writer: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(WRITES_OUTSTANDING)

    # ------------------------------------------------------------------ queries

    def exists(self) -> bool:
        return self.place.exists(META)

    def where(self, key: str = "") -> str | Path:
        """How messages name the store, or one golden (or object) in it."""
        return self.place.where(key)

    def key(self, test_id: str, seed: int) -> str:
        return store_key(test_id, seed)

    def info(self, test_id: str, seed: int) -> GoldenInfo | None:
        """Metadata only; None when there is no golden. Unreadable metadata gives an info
        with `problem` set (and an empty spec hash, so record sees it as stale)."""
        key = store_key(test_id, seed)
        self.units.listed()
        if not self._present(key):
            return None
        try:
            attrs = self._attrs(key, test_id, seed)
            return info_from_attrs(attrs, key)
        except MissingGolden:
            return None
        except CorruptGolden as exc:
            return GoldenInfo(test_id, seed, "", "", "", "", {}, "", key, problem=exc.reason)
        except (KeyError, TypeError, ValueError) as exc:
            return GoldenInfo(test_id, seed, "", "", "", "", {}, "", key,
                              problem=f"malformed attributes ({exc!r})")

    def index(self, only: Collection[str] | None = None) -> list[GoldenInfo]:
        """Every golden, sorted by test id then seed. Everything else in the store is
        included too, with `problem` set and whatever id could be recovered: a golden whose
        metadata cannot be read, one stored under another golden's key (its id edited),
        one whose id holds control characters, and every entry that is no golden at all
        (a file, a symbolic link, a folder without zarr.json). With `only`, the entries
        under those keys alone, the same as in the whole index (the others are not read)."""
        infos = []
        keys, strays = self._survey()
        if only is not None:
            keys, strays = [k for k in keys if k in only], [s for s in strays if s.name in only]
        for key in keys:
            try:
                infos.append(self._checked_info(key))
            except CorruptGolden as exc:
                at = f" ({printable(str(exc.path))})" if exc.path is not None else ""
                infos.append(self._recovered_info(key, exc.reason + at))
            except (KeyError, TypeError, ValueError) as exc:
                infos.append(self._recovered_info(key, f"malformed attributes ({exc!r})"))
        infos += [self._recovered_info(stray.name, self._stray_problem(stray)) for stray in strays]
        if only is None:
            infos += [self._recovered_info(name, why) for name, why in self.packs.problems.items()]
        return sorted(infos, key=lambda i: (i.test_id, i.seed))

    def _checked_info(self, key: str) -> GoldenInfo:
        """The info of the golden under `key`. One whose id holds control characters, or
        does not belong under this key (an edited id), is named by its key instead: the id
        it claims may be another golden's, and each entry must be reported once."""
        info = info_from_attrs(self._attrs(key), key)
        if printable(info.test_id) != info.test_id:
            return self._recovered_info(key, f"its test_id {info.test_id!r} holds control characters")
        expected = store_key(info.test_id, info.seed)
        if key != expected:
            return self._recovered_info(key, f"it holds test {info.test_id!r} seed {info.seed}, whose golden "
                                             f"belongs under {expected}")
        return info

    def _stray_problem(self, stray: Stray) -> str:
        return (f"{printable(str(self.where(stray.name)))} is {printable(stray.what)}, not a golden (a folder "
                f"holding {META})")

    def read(self, test_id: str, seed: int) -> Golden:
        """The whole golden, every array checked (crc32c and sha256); raises MissingGolden
        or CorruptGolden."""
        key = store_key(test_id, seed)
        try:
            return self._read(key, test_id, seed)
        except CorruptGolden:
            if not (self.units.forget(key) or self.packs.forget()):
                raise
        # a golden replaced since its metadata was read (and kept): read it afresh, once
        return self._read(key, test_id, seed)

    def _read(self, key: str, test_id: str, seed: int) -> Golden:
        entry = self._packed(key)
        path = self.where(entry.pack if entry else key)
        meta = self._metadata(key, test_id, seed)
        attrs = meta["attributes"]
        shape = meta.get("shape")
        nbytes = shape[0] if isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) else None
        found = metadata_problems(attrs, nbytes)
        if found:
            more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
            raise CorruptGolden(test_id, seed, "", "; ".join(found[:3]) + more, self.where(f"{key}/{META}"))
        try:
            info_from_attrs(attrs, key)
            records = tensor_records(attrs)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptGolden(test_id, seed, "", f"malformed attributes ({exc})",
                                self.where(f"{key}/{META}")) from None
        try:
            data = self.packs.read(entry)[1] if entry else self.loose_data(key, meta)
            tensors = unpack(data, records)
        except PackError as exc:
            array = next((n for n in records if f"'{n}'" in str(exc)), "")
            raise CorruptGolden(test_id, seed, array, str(exc), path) from None
        try:
            return decode(attrs, tensors)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorruptGolden(test_id, seed, "", "its attributes do not match its tensors "
                                f"({type(exc).__name__}: {exc})", self.where(f"{key}/{META}")) from None

    def _objects(self, key: str) -> set[str]:
        """The names of the objects a golden's folder holds."""
        return {e.key.split("/", 1)[1] for e in self.place.list(key) if "/" in e.key}

    def loose_data(self, key: str, meta: dict[str, Any]) -> bytes:
        """The packed data of the loose golden under `key`, described by its zarr.json `meta`
        (every chunk's crc32c checked); raises PackError."""
        return read_data(lambda name, limit: self.place.get(f"{key}/{name}", max_bytes=limit), meta,
                         lambda: self.place.zarr_array(key), lambda: self._objects(key))

    def loose(self) -> list[str]:
        """The keys of the loose goldens (one unit each; damaged ones too), not the packs."""
        return [n for n in self._survey_units()[0] if not is_pack(n)]

    def remove_loose(self, key: str, marker: bytes) -> bool:
        """Delete the loose golden under `key` if its zarr.json still holds `marker` (one
        recorded since stays); True when it went."""
        try:
            if self.units.marker_of(key) != marker:
                return False
        except FileNotFoundError:
            return False
        self.place.remove(key, META)
        self.units.removed(key)
        return True

    def read_definition(self, test_id: str, seed: int) -> dict[str, Any]:
        """The expanded test definition stored with the golden (metadata only)."""
        key = store_key(test_id, seed)
        if not self._present(key):
            raise MissingGolden(test_id, seed, self.root)
        definition = self._attrs(key, test_id, seed).get("definition")
        if not isinstance(definition, dict):
            raise CorruptGolden(test_id, seed, "", "the stored test definition is missing",
                                self.where(f"{key}/{META}"))
        return definition

    def verify(self, test_id: str | None = None, *, definitions: bool = True) -> list[tuple[GoldenInfo, str]]:
        """(info, problem) for every golden (or those of one test) that check would call
        CORRUPT. With `definitions`, each stored definition is also rebuilt and hashed."""
        return [(f.info, f.message) for f in self.findings(test_id, definitions=definitions)
                if f.kind is GoldenState.CORRUPT]

    def findings(self, test_id: str | None = None, *, definitions: bool = True) -> list[Finding]:
        """Everything verification says about the goldens: every reason `read` refuses
        one and, with `definitions`, what rebuilding its definition says (see Finding)."""
        out = []
        for info in self.index():
            if test_id is not None and info.test_id != test_id:
                continue
            if info.problem:
                out.append(Finding(info, GoldenState.CORRUPT, info.problem))
                continue
            try:
                golden = self.read(info.test_id, info.seed)
            except CorruptGolden as exc:
                out.append(Finding(info, GoldenState.CORRUPT, exc.reason))
                continue
            if definitions:
                found = definition_findings(golden.test_id, golden.definition, golden.suite, golden.spec_hash,
                                            golden.test_type)
                out += [Finding(info, GoldenState.CORRUPT, m) for m in found.problems]
                out += [Finding(info, GoldenState.STALE, m) for m in found.stale]
                out += [Finding(info, GoldenState.UNCHECKED, m) for m in found.unchecked]
        if test_id is None:   # the ledger of baseline failures is stored data too
            ledger = GoldenInfo("the ledger of baseline failures", 0, "", "", "", "", {}, "", LEDGER)
            out += [Finding(ledger, GoldenState.CORRUPT, m) for m in self.ledger_problems()]
        return out

    def check_writable(self) -> None:
        """Raise GoldenWriteError unless goldens can be written here (creates the store)."""
        try:
            self._ensure_root()
            self.place.probe()
        except OSError as exc:
            raise GoldenWriteError(f"cannot write to the golden store {self.root} ({_why(exc)}). "
                                   "Make it writable, or point --goldens at a writable folder; nothing "
                                   "was recorded.") from None
        except StorageError as exc:
            raise GoldenWriteError(f"cannot write to the golden store {self.root}, so nothing was "
                                   f"recorded: {exc}") from None

    def baseline_failures(self) -> dict[str, BaselineFailure]:
        """Store key -> why the baseline failed when (test, seed) was last recorded
        (goldens/ledger.py: kept in the store, one entry per test and seed)."""
        return self.ledger.failures()

    def ledger_problems(self) -> list[str]:
        """What is wrong with the stored baseline failures (each entry left out)."""
        return self.ledger.problems()

    def note_baseline(self, test_id: str, seed: int, failure: BaselineFailure | None) -> None:
        """Remember that the baseline failed on (test, seed), or forget it (None) once a
        golden is written."""
        try:
            self._ensure_root()
            self.ledger.note(store_key(test_id, seed), failure)
        except OSError as exc:
            raise GoldenWriteError(f"cannot note in the golden store {self.root} that the baseline failed on "
                                   f"test '{test_id}' seed {seed} ({_why(exc)}).") from None
        except StorageError as exc:
            raise GoldenWriteError(f"cannot note in the golden store {self.root} that the baseline failed on "
                                   f"test '{test_id}' seed {seed}: {exc}") from None

    # ------------------------------------------------------------------ writes

    def write(self, golden: Golden) -> str:
        """Store `golden` atomically, replacing any golden of the same (test id, seed).
        Returns its key. An id holding a control character is refused: reading such a
        golden back calls it CORRUPT (validate.py), as no suite can give a test that id."""
        return self._publish(golden, *self._prepare(golden))

    def write_later(self, golden: Golden) -> "Future[str]":
        """`write`, with the publishing done by one of WRITE_THREADS threads on a remote
        store: the future gives the key, or raises GoldenWriteError. What `write` refuses
        before touching the store (an id, a value it cannot hold) raises here; on a local
        disk the golden is written before this returns. Blocks while WRITES_OUTSTANDING
        goldens are on their way. `stop_writes` ends the threads."""
        if not self.place.remote:
            done: Future[str] = Future()
            done.set_result(self.write(golden))
            return done
        prepared = self._prepare(golden)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="golden-write")
        self._slots.acquire()
        try:
            future = self._writer.submit(self._publish, golden, *prepared)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def stop_writes(self) -> None:
        """Drop the writes handed to `write_later` that have not started, wait for those
        under way (each is whole or invisible), and end the threads."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True, cancel_futures=True)

    def _prepare(self, golden: Golden) -> tuple[str, dict[str, bytes], bool]:
        """(key, objects, whether no golden of that key was seen) of a golden to publish."""
        control = unsafe_char(golden.test_id)
        if control:
            raise OpdiffError(f"cannot store a golden of test '{printable(golden.test_id)}': its id holds {control}, "
                              "a control, bidi or line-separator character; give the test a plain-text id.")
        try:
            self._ensure_root()
        except OSError as exc:
            raise self._write_error(golden, exc) from None
        except StorageError as exc:
            raise GoldenWriteError(f"cannot write the golden of test '{golden.test_id}' seed {golden.seed}: "
                                   f"{exc}") from None
        key = store_key(golden.test_id, golden.seed)
        attrs, named = encode(golden)
        records, data = pack(named)
        attrs["tensors"] = {name: rec.to_json() for name, rec in records.items()}
        objects = packed_objects(attrs, data)
        return key, objects, self.units.seen_absent(key)

    def _publish(self, golden: Golden, key: str, objects: dict[str, bytes], fresh: bool) -> str:
        try:
            self.place.publish(key, objects, META, fresh=fresh)
        except OSError as exc:
            raise self._write_error(golden, exc) from None
        except StorageError as exc:
            raise GoldenWriteError(f"cannot write the golden of test '{golden.test_id}' seed {golden.seed}: "
                                   f"{exc} Goldens already in the store are whole (a golden becomes "
                                   "visible only once all of it is written); run `opdiff record` again: "
                                   "it records only what is missing.") from None
        self.units.published(key, objects[META])
        return key

    def _write_error(self, golden: Golden, exc: OSError) -> GoldenWriteError:
        return GoldenWriteError(
            f"cannot write the golden of test '{golden.test_id}' seed {golden.seed} into the golden "
            f"store {self.root} ({_why(exc)}): the disk may be full or the store read-only. Goldens "
            "already in the store are untouched (each is written aside and moved in whole); free "
            "space or fix the permissions, then run `opdiff record` again: it records only what is "
            "missing.")

    def delete(self, test_id: str, seed: int) -> None:
        key = store_key(test_id, seed)
        if not self._present(key):
            raise MissingGolden(test_id, seed, self.root)
        self._remove(key)

    def delete_key(self, key: str) -> None:
        """Delete by store key (GoldenInfo.key): works for goldens whose metadata, and so
        whose test id, cannot be read."""
        if "/" in key or key.startswith(".") or not self._present(key):
            raise OpdiffError(f"{self.root}: no golden under key '{key}'.")
        self._remove(key)

    def clean_debris(self, max_age_s: float = DEBRIS_MAX_AGE_S) -> int:
        """Remove what writers that died left behind: local staging and trash whose process
        is gone on this host or older than `max_age_s`; on an object store, goldens without
        their zarr.json older than that. Returns how many entries went."""
        return self.place.clean_debris(max_age_s, META, keep=(META,))

    # ------------------------------------------------------------------ internals

    def _ensure_root(self) -> None:
        """Create the root group; safe when several writers do it at once (create-only)."""
        if self._ready:
            return
        subs = ("", *self.place.bookkeeping)
        for sub, attrs in ((sub, ROOT_ATTRS if not sub else {}) for sub in subs):
            # the place's own folders (locally .staging and .trash) are (empty) groups too, so zarr
            # lists the root cleanly
            key = f"{sub}/{META}" if sub else META
            if not self.place.exists(key):
                body = {"zarr_format": 3, "node_type": "group", "attributes": attrs}
                self.place.put(key, json.dumps(body, separators=(",", ":")).encode(), create=True)
        self.clean_debris()
        self._ready = True

    def _remove(self, key: str) -> None:
        """Delete the golden under `key`: the loose one, and any packed copy."""
        try:
            self.place.remove(key, META)
            if self._packed(key, loose_wins=False) is not None:
                self.packs.remove_key(key)
        except PackError as exc:
            raise GoldenWriteError(f"cannot delete the golden {key} from the golden store {self.root}: the pack "
                                   f"holding it is damaged ({exc}); run `opdiff goldens verify`.") from None
        except StorageError as exc:
            raise GoldenWriteError(f"cannot delete the golden {key} from the golden store {self.root}: {exc}") \
                from None
        except OSError as exc:
            raise GoldenWriteError(f"cannot delete the golden {key} from the golden store {self.root} "
                                   f"({_why(exc)}); it is still there, unchanged.") from None
        self.units.removed(key)

    def _survey(self) -> tuple[list[str], list[Stray]]:
        """(every folder, every other entry) at the top of the store, but its own root
        zarr.json and hidden bookkeeping (.staging, .trash)."""
        names, strays = self._survey_units()
        loose = [n for n in names if not is_pack(n)]
        return sorted(set(loose) | self.packs.entries().keys()), strays

    def _survey_units(self) -> tuple[list[str], list[Stray]]:
        """(every unit, loose goldens and packs, every stray); the packs' indexes read anew."""
        try:
            names, strays = self.units.survey()
        except OSError as exc:
            raise OpdiffError(f"cannot list the golden store {self.root} ({_why(exc)}); check --goldens "
                              "and its permissions.") from None
        self.packs.load(n for n in names if is_pack(n))
        return names, strays

    def _present(self, key: str) -> bool:
        return self.units.present(key) or self._packed(key) is not None

    def _packed(self, key: str, *, loose_wins: bool = True) -> PackEntry | None:
        """Where the golden under `key` lies in a pack, unless a loose golden of that key
        (which wins) is there."""
        if loose_wins and self.units.present(key):
            return None
        if not self.packs.loaded:
            self._survey()
        return self.packs.get(key)

    def _attrs(self, key: str, test_id: str | None = None, seed: int | None = None) -> dict[str, Any]:
        return self._metadata(key, test_id, seed)["attributes"]

    def _metadata(self, key: str, test_id: str | None = None, seed: int | None = None) -> dict[str, Any]:
        """The golden array's zarr.json; raises CorruptGolden if unreadable or if they
        name another (test id, seed) than asked."""
        path = self.where(f"{key}/{META}")
        tid = test_id if test_id is not None else unknown_entry(key)
        sd = seed if seed is not None else (seed_of_key(key) or 0)
        entry = self._packed(key)
        path = self.where(entry.pack) if entry else path
        try:
            meta = (array_metadata(entry.data_nbytes, self.packs.attributes(entry)) if entry
                    else parse_metadata(self.units.marker_of(key)))
        except UnitMissing:
            if test_id is not None:   # no golden (or not yet a whole one)
                raise MissingGolden(test_id, sd, self.root) from None
            raise CorruptGolden(tid, sd, "", f"{META} is missing", path) from None
        except FileNotFoundError:
            raise CorruptGolden(tid, sd, "", f"{META} is missing", path) from None
        except OSError as exc:
            raise CorruptGolden(tid, sd, "", f"{META} is unreadable ({exc.strerror or exc})", path) from None
        except PackError as exc:
            raise CorruptGolden(tid, sd, "", str(exc), path) from None
        attrs = meta["attributes"]
        if meta.get("node_type") != "array" or MARK not in attrs:
            raise CorruptGolden(tid, sd, "", f"{META} is not a golden's metadata", path)
        if test_id is not None and (attrs.get("test_id"), attrs.get("seed")) != (test_id, seed):
            raise CorruptGolden(tid, sd, "", f"it holds test {attrs.get('test_id')!r} seed "
                                f"{attrs.get('seed')!r} instead", path)
        return meta

    def _recovered_info(self, key: str, problem: str) -> GoldenInfo:
        return GoldenInfo(unknown_entry(key), seed_of_key(key) or 0, "", "", "", "", {}, "", key,
                          problem=problem)


def _why(exc: OSError) -> str:
    return f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else (exc.strerror or str(exc))
