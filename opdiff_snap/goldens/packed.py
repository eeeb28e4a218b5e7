"""A golden's tensors packed back to back into one Zarr v3 uint8 array.

One array per golden keeps a golden to two small files (zarr.json and one chunk), which
is what makes writing and reading one cheap. The form the store writes, which plain zarr
reads as is: 1-D uint8, regular chunks of up to CHUNK_BYTES (one chunk for small
goldens), chunk key encoding `v2` (chunk files `0`, `1`, ...), codecs `bytes` then
`crc32c` (four checksum bytes appended to each chunk). Every chunk is written, zeros
included (zarr's write_empty_chunks=True), so a lost chunk is an error, never zeros.

Each tensor is a byte range described in the attributes (offset, nbytes, shape, the NumPy
dtype of its little-endian bytes, its torch dtype, sha256). bfloat16, float8 and
complex32, which NumPy and zarr lack, are described as the same-width unsigned integer.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import google_crc32c

from ..storage import ObjectTooLarge

if TYPE_CHECKING:
    import torch

META = "zarr.json"
CHUNK_BYTES = 64 * 2**20

# torch dtype -> (NumPy dtype of its little-endian bytes, bytes per element); a table, so that
# reading metadata (goldens ls, validation) needs no torch
_LAYOUT: dict[str, tuple[str, int]] = {
    "bool": ("bool", 1), "int8": ("int8", 1), "int16": ("int16", 2), "int32": ("int32", 4),
    "int64": ("int64", 8), "uint8": ("uint8", 1), "uint16": ("uint16", 2), "uint32": ("uint32", 4),
    "uint64": ("uint64", 8), "float16": ("float16", 2), "float32": ("float32", 4), "float64": ("float64", 8),
    "complex64": ("complex64", 8), "complex128": ("complex128", 16), "bfloat16": ("uint16", 2),
    "complex32": ("uint32", 4), "float8_e4m3fn": ("uint8", 1), "float8_e5m2": ("uint8", 1),
    "float8_e4m3fnuz": ("uint8", 1), "float8_e5m2fnuz": ("uint8", 1),
}
STORED_AS: dict[str, str] = {name: stored for name, (stored, _) in _LAYOUT.items()}
ITEMSIZE: dict[str, int] = {name: size for name, (_, size) in _LAYOUT.items()}


class PackError(Exception):
    """What went wrong reading the packed data (the store turns it into CorruptGolden)."""


@dataclass(frozen=True)
class TensorRecord:
    """Where one tensor lies in the packed bytes, and what it must read back as."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    torch_dtype: str
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "nbytes": self.nbytes, "shape": list(self.shape),
                "dtype": STORED_AS[self.torch_dtype], "torch_dtype": self.torch_dtype, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: Any) -> TensorRecord:
        try:
            rec = cls(int(d["offset"]), int(d["nbytes"]), tuple(int(n) for n in d["shape"]),
                      str(d["torch_dtype"]), str(d["sha256"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PackError(f"its record is malformed ({exc!r})") from None
        if rec.torch_dtype not in STORED_AS:
            raise PackError(f"unknown torch dtype {rec.torch_dtype!r}")
        if d.get("dtype") != STORED_AS[rec.torch_dtype]:
            raise PackError(f"dtype {d.get('dtype')!r} is not the NumPy dtype {rec.torch_dtype} is stored as")
        if any(n < 0 for n in rec.shape):
            raise PackError(f"shape {list(rec.shape)} has a negative size")
        numel = 1
        for n in rec.shape:
            numel *= n
        if rec.offset < 0 or numel * ITEMSIZE[rec.torch_dtype] != rec.nbytes:
            raise PackError(f"offset {rec.offset} / nbytes {rec.nbytes} do not fit shape {list(rec.shape)}")
        return rec


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's elements in C order, little endian, as raw bytes."""
    import torch

    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little endian
        raise RuntimeError("the golden store writes little-endian data only")
    name = str(t.dtype).removeprefix("torch.")
    if name not in STORED_AS:
        raise TypeError(f"cannot store a tensor of dtype {t.dtype} in a golden "
                        f"(supported: {', '.join(sorted(STORED_AS))})")
    if t.layout != torch.strided:
        raise TypeError(f"cannot store a {t.layout} tensor in a golden; convert it to dense first")
    if t.numel() == 0:
        return b""
    t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def pack(named: list[tuple[str, torch.Tensor]]) -> tuple[dict[str, TensorRecord], bytes]:
    records, parts, offset = {}, [], 0
    for name, t in named:
        data = tensor_bytes(t)
        records[name] = TensorRecord(offset, len(data), tuple(t.shape),
                                     str(t.dtype).removeprefix("torch."), hashlib.sha256(data).hexdigest())
        parts.append(data)
        offset += len(data)
    return records, b"".join(parts)


def array_metadata(nbytes: int, attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        "zarr_format": 3, "node_type": "array", "shape": [nbytes], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [_chunk_len(nbytes)]}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
        "fill_value": 0, "codecs": [{"name": "bytes"}, {"name": "crc32c"}],
        "attributes": attributes, "storage_transformers": [],
    }


def _chunk_len(nbytes: int) -> int:
    return max(1, min(nbytes, CHUNK_BYTES))


def packed_objects(attributes: dict[str, Any], data: bytes) -> dict[str, bytes]:
    """The objects of the Zarr array holding `data`: chunk files `0`, `1`, ... and zarr.json."""
    objects: dict[str, bytes] = {}
    step = _chunk_len(len(data))
    for i, start in enumerate(range(0, len(data), step)):
        chunk = data[start:start + step]
        if len(chunk) < step:  # zarr stores edge chunks at full size
            chunk += bytes(step - len(chunk))
        objects[str(i)] = chunk + struct.pack("<I", google_crc32c.value(chunk))
    objects[META] = json.dumps(array_metadata(len(data), attributes), separators=(",", ":")).encode("utf-8")
    return objects


def parse_metadata(raw: bytes) -> dict[str, Any]:
    """The array's zarr.json from its bytes; raises PackError if unreadable."""
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise PackError(f"{META} is unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("attributes"), dict):
        raise PackError(f"{META} has no attributes")
    return meta


def read_data(get: Callable[[str, int], bytes], meta: dict[str, Any], zarr_open: Callable[[], Any],
              stored: Callable[[], set[str]]) -> bytes:
    """The packed bytes, every chunk's crc32c checked. `get(name, max_bytes)` reads one
    object of the array (raising FileNotFoundError, or OSError when it holds more than
    `max_bytes`); `stored()` names the objects the array has. Other zarr forms are read
    through `zarr_open()`, once every chunk they need is known to be there (zarr would
    read a missing chunk as zeros)."""
    try:
        nbytes = int(meta["shape"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        raise PackError(f"{META} has no valid shape") from None
    if nbytes < 0:
        raise PackError(f"{META} declares a negative length ({nbytes})")
    if meta != array_metadata(nbytes, meta["attributes"]):
        return _read_with_zarr(zarr_open, meta, nbytes, stored)
    step = _chunk_len(nbytes)
    parts = []
    for i, start in enumerate(range(0, nbytes, step)):
        try:
            raw = get(str(i), step + 4)
        except FileNotFoundError:
            raise PackError(f"chunk file {i} is missing") from None
        except ObjectTooLarge:
            raise PackError(f"chunk file {i} holds more than the {step + 4} bytes of a chunk") from None
        except OSError as exc:
            raise PackError(f"chunk file {i} is unreadable ({exc.strerror or exc})") from None
        if len(raw) != step + 4:
            raise PackError(f"chunk file {i} has {len(raw)} bytes, expected {step + 4}")
        if struct.pack("<I", google_crc32c.value(raw[:-4])) != raw[-4:]:
            raise PackError(f"crc32c checksum of chunk file {i} does not match")
        parts.append(raw[:min(step, nbytes - start)])
    return b"".join(parts)


def unpack(data: bytes, records: dict[str, TensorRecord]) -> dict[str, torch.Tensor]:
    """Raises PackError naming the tensor whose bytes are out of range or fail sha256."""
    import torch

    tensors = {}
    for name, rec in records.items():
        piece = data[rec.offset:rec.offset + rec.nbytes]
        if len(piece) != rec.nbytes:
            raise PackError(f"tensor '{name}' lies outside the packed data")
        if hashlib.sha256(piece).hexdigest() != rec.sha256:
            raise PackError(f"sha256 of tensor '{name}' does not match the one recorded")
        dtype = getattr(torch, rec.torch_dtype)
        tensors[name] = (torch.frombuffer(bytearray(piece), dtype=dtype).reshape(rec.shape) if piece
                         else torch.empty(rec.shape, dtype=dtype))
    return tensors


def _read_with_zarr(zarr_open: Callable[[], Any], meta: dict[str, Any], nbytes: int,
                    stored: Callable[[], set[str]]) -> bytes:
    """A golden rewritten in another valid zarr form (other chunks or codecs): slow path."""
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array" or meta.get("data_type") != "uint8" \
            or len(meta.get("shape", ())) != 1:
        raise PackError(f"{META} does not describe a 1-D uint8 Zarr v3 array")
    count, chunk_key = _chunk_keys(meta, nbytes)
    present = stored()
    # more chunks than objects means one is missing: found within len(present) + 1 names
    for i in range(min(count, len(present) + 1)):
        if chunk_key(i) not in present:
            raise PackError(f"chunk file {chunk_key(i)} is missing (zarr would read it as zeros)")
    import numpy as np

    try:
        return np.asarray(zarr_open()[...]).tobytes()
    except Exception as exc:  # zarr raises many types for damaged arrays
        raise PackError(f"zarr could not read it ({type(exc).__name__}: {exc})") from None


def _chunk_keys(meta: dict[str, Any], nbytes: int) -> tuple[int, Callable[[int], str]]:
    """(how many chunks the array has, the object name of chunk i) for the regular chunk
    grids and the chunk key encodings of Zarr v3."""
    grid: Any = meta.get("chunk_grid")
    encoding: Any = meta.get("chunk_key_encoding")
    try:
        (chunk,) = grid["configuration"]["chunk_shape"] if grid["name"] == "regular" else (None,)
        name = encoding["name"]
        separator = (encoding.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    except (KeyError, TypeError, ValueError, AttributeError):
        chunk = name = separator = None
    if not (isinstance(chunk, int) and chunk > 0 and name in ("default", "v2") and separator in ("/", ".")):
        raise PackError(f"{META} has no regular chunk grid and chunk key encoding this store reads")
    if name == "default":
        return -(-nbytes // chunk), lambda i: f"c{separator}{i}"
    return -(-nbytes // chunk), str
