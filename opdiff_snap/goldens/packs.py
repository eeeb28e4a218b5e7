"""Packs: many small goldens in one compressed Zarr array, so that a store of thousands of
goldens is a few dozen files instead of two files and a folder per golden.

A pack is a unit of the store named `pack.<group>.<digest>` (a name no golden key can take:
keys hold no `.`): a 1-D uint8 Zarr v3 array whose data is, golden after golden, the
golden's attributes as compact UTF-8 JSON followed by its packed tensor bytes (exactly what
a loose golden's `zarr.json` attributes and chunk hold). Regular chunks of PACK_CHUNK bytes,
chunk key encoding `v2`, codecs `bytes`, `gzip` and `crc32c`: plain zarr reads it as is, and
every chunk is checked against its crc32c before it is decompressed. The array's attributes
name the goldens: `{"opdiff_snap_pack": 1, "group": ..., "goldens": {key: [offset,
attributes bytes, data bytes]}}`. `<group>` is the golden's suite, flattened to a safe name;
`<digest>` is sha256 of the pack's uncompressed content, so packing the same goldens again
gives the same pack.

A golden written after packing is written loose (docs/goldens-layout.md) and wins over a
packed copy of the same key; `opdiff goldens pack` (goldens/repack.py) folds loose goldens
into packs. This module reads and encodes packs; it knows nothing of golden attributes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import google_crc32c

from ..storage import ObjectTooLarge, Place
from .packed import META, PackError

PACK_PREFIX = "pack."
PACK_MARK = "opdiff_snap_pack"
PACK_CHUNK = 256 * 1024          # uncompressed bytes per chunk: what reading one golden decompresses
PACK_MAX_GOLDEN = 64 * 1024      # tensor bytes of the largest golden packed; larger ones stay loose
GZIP_LEVEL = 6
CACHED_CHUNKS = 64               # decompressed chunks kept per store (16 MiB at most)
_UNSAFE = re.compile(r"[^a-z0-9_-]+")


def is_pack(name: str) -> bool:
    return name.startswith(PACK_PREFIX)


def group_of(suite: Any) -> str:
    """The pack group of a golden recorded from `suite` (its path as stored)."""
    return _UNSAFE.sub("_", str(suite or "").lower()).strip("_-")[:64] or "nosuite"


@dataclass(frozen=True)
class PackEntry:
    """Where one golden lies in a pack: its attributes at `offset`, its data right after."""

    pack: str
    offset: int
    attrs_nbytes: int
    data_nbytes: int


def pack_metadata(nbytes: int, attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        "zarr_format": 3, "node_type": "array", "shape": [nbytes], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [_step(nbytes)]}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}, {"name": "gzip", "configuration": {"level": GZIP_LEVEL}}, {"name": "crc32c"}],
        "attributes": attributes, "storage_transformers": [],
    }


def _step(nbytes: int) -> int:
    return max(1, min(nbytes, PACK_CHUNK))


def encode_pack(group: str, goldens: Iterable[tuple[str, bytes, bytes]]) -> tuple[str, dict[str, bytes]]:
    """(unit name, objects) of the pack holding `goldens`: (key, attributes JSON, data),
    laid out in key order."""
    index, parts, offset = {}, [], 0
    for key, attrs, data in sorted(goldens):
        index[key] = [offset, len(attrs), len(data)]
        parts += [attrs, data]
        offset += len(attrs) + len(data)
    raw = b"".join(parts)
    meta = json.dumps(pack_metadata(len(raw), {PACK_MARK: 1, "group": group, "goldens": index}),
                      separators=(",", ":")).encode("utf-8")
    objects: dict[str, bytes] = {}
    step = _step(len(raw))
    for i, start in enumerate(range(0, len(raw), step)):
        chunk = raw[start:start + step].ljust(step, b"\0")   # zarr stores edge chunks at full size
        packed = gzip.compress(chunk, compresslevel=GZIP_LEVEL, mtime=0)
        objects[str(i)] = packed + struct.pack("<I", google_crc32c.value(packed))
    objects[META] = meta
    digest = hashlib.sha256(meta + raw).hexdigest()[:16]
    return f"{PACK_PREFIX}{group}.{digest}", objects


def parse_pack(name: str, raw: bytes) -> tuple[int, str, dict[str, PackEntry]]:
    """(length, group, key -> entry) from a pack's zarr.json; raises PackError."""
    try:
        meta = json.loads(raw)
        attrs = meta["attributes"]
        nbytes = int(meta["shape"][0])
        index = attrs["goldens"]
        group = attrs["group"]
    except (ValueError, RecursionError, KeyError, IndexError, TypeError) as exc:
        raise PackError(f"{META} of pack {name} is unreadable ({type(exc).__name__}: {exc})") from None
    if attrs.get(PACK_MARK) != 1 or meta != pack_metadata(nbytes, attrs) or not isinstance(index, dict) \
            or not isinstance(group, str):
        raise PackError(f"{META} of pack {name} is not in the form this version reads (opdiff_snap_pack 1, "
                        "regular chunks, codecs bytes, gzip and crc32c)")
    entries = {}
    for key, where in index.items():
        if not (isinstance(where, list) and len(where) == 3 and all(type(n) is int and n >= 0 for n in where)
                and where[0] + where[1] + where[2] <= nbytes):
            raise PackError(f"{META} of pack {name}: the entry of {key!r} is not three offsets inside the pack")
        entries[key] = PackEntry(name, *where)
    return nbytes, group, entries


class Packs:
    """The packs of a store: which key lies in which pack, and reading one golden's bytes.
    `marker_of(name)` gives a unit's zarr.json bytes (the store's Units)."""

    def __init__(self, place: Place, marker_of: Callable[[str], bytes]):
        self.place, self._marker_of = place, marker_of
        self._entries: dict[str, PackEntry] | None = None
        self.lengths: dict[str, int] = {}
        self.groups: dict[str, str] = {}
        self.problems: dict[str, str] = {}      # pack name -> why it cannot be read
        self._chunks: dict[tuple[str, int], bytes] = {}

    @property
    def loaded(self) -> bool:
        return self._entries is not None

    def load(self, names: Iterable[str]) -> None:
        """Read the zarr.json of every pack in `names` (a survey's units that are packs).
        A key in two packs (only while a repack is under way) is read from the one whose
        name sorts last: their copies are the same, or a loose golden wins over both."""
        entries: dict[str, PackEntry] = {}
        self.lengths, self.groups, self.problems, self._chunks = {}, {}, {}, {}
        for name in sorted(names):
            try:
                nbytes, group, found = parse_pack(name, self._marker_of(name))
            except PackError as exc:
                self.problems[name] = str(exc)
                continue
            except OSError as exc:
                self.problems[name] = f"{META} of pack {name} is unreadable ({exc.strerror or exc})"
                continue
            self.lengths[name], self.groups[name] = nbytes, group
            entries.update(found)
        self._entries = entries

    def entries(self) -> dict[str, PackEntry]:
        return self._entries or {}

    def get(self, key: str) -> PackEntry | None:
        return (self._entries or {}).get(key)

    def forget(self) -> bool:
        """Drop what was read (another process repacked); True when something was."""
        had, self._entries, self._chunks = self._entries is not None, None, {}
        return had

    def read(self, entry: PackEntry) -> tuple[bytes, bytes]:
        """(attributes JSON, data) of one golden, each chunk it spans checked (crc32c) and
        decompressed; raises PackError."""
        nbytes = self.lengths.get(entry.pack)
        if nbytes is None:
            raise PackError(f"pack {entry.pack} is gone (repacked meanwhile?)")
        end = entry.offset + entry.attrs_nbytes + entry.data_nbytes
        step = _step(nbytes)
        raw = b"".join(self._chunk(entry.pack, i, step) for i in range(entry.offset // step, -(-end // step)))
        base = (entry.offset // step) * step
        body = raw[entry.offset - base:end - base]
        return body[:entry.attrs_nbytes], body[entry.attrs_nbytes:]

    def attributes(self, entry: PackEntry) -> dict[str, Any]:
        """A packed golden's attributes; raises PackError."""
        try:
            attrs = json.loads(self.read(entry)[0])
        except (ValueError, RecursionError) as exc:
            raise PackError(f"its attributes in pack {entry.pack} are unreadable ({type(exc).__name__}: {exc})") \
                from None
        if not isinstance(attrs, dict):
            raise PackError(f"its attributes in pack {entry.pack} are not a JSON object")
        return attrs

    def _chunk(self, pack: str, i: int, step: int) -> bytes:
        cached = self._chunks.get((pack, i))
        if cached is not None:
            return cached
        limit = step + step // 100 + 1024        # gzip never grows a chunk by more
        try:
            stored = self.place.get(f"{pack}/{i}", max_bytes=limit)
        except FileNotFoundError:
            raise PackError(f"chunk file {i} of pack {pack} is missing") from None
        except ObjectTooLarge:
            raise PackError(f"chunk file {i} of pack {pack} holds more than the {limit} bytes a chunk "
                            "compresses to at most") from None
        except OSError as exc:
            raise PackError(f"chunk file {i} of pack {pack} is unreadable ({exc.strerror or exc})") from None
        if len(stored) < 4 or struct.pack("<I", google_crc32c.value(stored[:-4])) != stored[-4:]:
            raise PackError(f"crc32c checksum of chunk file {i} of pack {pack} does not match")
        try:
            inflate = zlib.decompressobj(wbits=31)     # gzip framing
            chunk = inflate.decompress(stored[:-4], step + 1)
        except zlib.error as exc:
            raise PackError(f"chunk file {i} of pack {pack} does not decompress ({exc})") from None
        if len(chunk) != step:
            raise PackError(f"chunk file {i} of pack {pack} decompresses to {len(chunk)} bytes, expected {step}")
        if len(self._chunks) >= CACHED_CHUNKS:
            self._chunks.pop(next(iter(self._chunks)))
        self._chunks[(pack, i)] = chunk
        return chunk

    def remove_key(self, key: str) -> None:
        """Take `key` out of every pack holding it: each such pack is written again without
        it (a new unit, published whole) before the old one is removed, so an interruption
        leaves the golden there, never another one lost. Raises PackError when a pack holding
        it cannot be read, OSError or StorageError when the place cannot be written."""
        for pack in [name for name in sorted(self.lengths) if self._holds(name, key)]:
            rest = [(k, *self.read(e)) for k, e in self._of_pack(pack).items() if k != key]
            if rest:
                name, objects = encode_pack(self.groups[pack], rest)
                self.place.publish(name, objects, META, fresh=True)
            self.place.remove(pack, META)
        self.forget()

    def _of_pack(self, pack: str) -> dict[str, PackEntry]:
        _, _, found = parse_pack(pack, self._marker_of(pack))
        return found

    def _holds(self, pack: str, key: str) -> bool:
        try:
            return key in self._of_pack(pack)
        except (PackError, OSError):
            return False
