"""The replay bundle's format (docs/bundles.md): what `opdiff bundle` writes, what a
runner on a device writes back, and how `check --outputs-from` reads both. Torch-free,
NumPy only; nothing read from a bundle is executed (arrays load with allow_pickle off).

    DIR/manifest.json              FORMAT, the build environment, one entry per (test, seed, preset)
    DIR/artifacts/<sha256>/...     each compiled artifact once (a file, or an .mlpackage folder)
    DIR/inputs/<entry>.npz         in0, in1, ...: what the runtime is fed, in its dtypes
    DIR/bundled/<entry>.bpte       ExecuTorch entries: a BundledProgram (program, inputs, expected)
    DIR/run_<family>.py            one runner per runtime family, beside bundle_io.py
    DIR/outputs/<entry>.npz        out0, out1, ...: written by the runner
    DIR/device-<family>.json       written by the runner: the device record and per-entry timings
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1
MANIFEST = "manifest.json"
_ENTRY_ID = re.compile(r"^e[0-9]{1,6}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")
_DTYPE = re.compile(r"^[a-z][a-z0-9_]{0,23}$")
MAX_JSON_BYTES = 64 << 20


class BundleError(Exception):
    """A bundle that cannot be read as written: its one-paragraph reason."""


@dataclass(frozen=True)
class ArraySpec:
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, array: np.ndarray) -> "ArraySpec":
        return cls(tuple(int(d) for d in array.shape), str(array.dtype))


@dataclass(frozen=True)
class Entry:
    """One (test, seed, preset) in the bundle. `outputs` are the golden's shapes (a runtime
    may return them in a narrower float dtype); `golden` is the golden's digest when bundled."""

    id: str
    test: str
    seed: int
    preset: str
    family: str
    artifact: str              # path in the bundle
    artifact_sha256: str
    inputs: str
    inputs_sha256: str
    input_specs: tuple[ArraySpec, ...]
    outputs: tuple[ArraySpec, ...]
    golden: str
    compute_units: str = ""    # CoreML's compute unit for the preset's device
    calibration: str = ""      # int8 presets: the digest of the calibration inputs
    bundled_program: str = ""  # ExecuTorch: the BundledProgram's path

    def outputs_path(self) -> str:
        return f"outputs/{self.id}.npz"


@dataclass(frozen=True)
class Left:
    """A selected (test, seed, preset) that is not in the bundle, with the verdict that says why."""

    test: str
    seed: int
    preset: str
    verdict: str
    message: str
    error_class: str = ""


@dataclass
class Manifest:
    created: str
    build: dict[str, Any]                 # the environment the artifacts were built in
    presets: dict[str, dict[str, Any]]    # name -> Preset.to_json()
    entries: list[Entry] = field(default_factory=list)
    left_out: list[Left] = field(default_factory=list)
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "created": self.created, "build": self.build, "presets": self.presets,
                "entries": [asdict(e) for e in self.entries], "left_out": [asdict(x) for x in self.left_out]}


def digest_path(path: Path) -> str:
    """sha256 of a file, or of a folder: each regular file's relative path and bytes, in order."""
    h = hashlib.sha256()
    if path.is_dir() and not path.is_symlink():
        for p in sorted(q for q in path.rglob("*") if q.is_file() and not q.is_symlink()):
            h.update(p.relative_to(path).as_posix().encode() + b"\0")
            h.update(_file_sha(p).encode())
        return h.hexdigest()
    return _file_sha(path)


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_json(path: Path, value: Any) -> None:
    """Whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True, allow_nan=False)
    os.replace(tmp, path)


def read_json(path: Path, what: str) -> Any:
    if not path.is_file() or path.is_symlink():
        raise BundleError(f"{path}: no {what} (a regular file) is there.")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise BundleError(f"{path}: the {what} is over {MAX_JSON_BYTES >> 20} MiB; it is not one this format writes.")
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: the {what} is not JSON ({exc}).") from None


def inside(root: Path, rel: Any, what: str) -> Path:
    """`rel` as a path inside the bundle `root`; anything that leaves it is refused."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or ".." in Path(rel).parts:
        raise BundleError(f"{root / MANIFEST}: the {what} path {rel!r} is not a relative path inside the bundle.")
    path = root / rel
    here = root.resolve()
    if not path.resolve().is_relative_to(here):
        raise BundleError(f"{root / MANIFEST}: the {what} path {rel!r} leads out of the bundle.")
    return path


def read_manifest(root: Path) -> Manifest:
    """The bundle's manifest, every field checked; a BundleError names what is wrong."""
    data = read_json(root / MANIFEST, "bundle manifest")
    where = root / MANIFEST
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise BundleError(f"{where}: format {found!r}; this opdiff-snap reads bundle format {FORMAT}. "
                          "Bundle again with this version (`opdiff bundle`).")
    try:
        entries = [_entry(e) for e in data["entries"]]
        left = [Left(str(x["test"]), int(x["seed"]), str(x["preset"]), _verdict(x["verdict"]), str(x["message"]),
                     str(x.get("error_class") or "")) for x in data.get("left_out") or []]
        presets = {str(k): dict(v) for k, v in data["presets"].items()}
        manifest = Manifest(str(data["created"]), dict(data["build"]), presets, entries, left)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleError(f"{where}: a field is missing or of the wrong kind ({type(exc).__name__}: {exc}); "
                          "the manifest is not one `opdiff bundle` wrote.") from None
    seen: set[str] = set()
    for e in entries:
        if e.id in seen:
            raise BundleError(f"{where}: entry id {e.id} appears twice.")
        seen.add(e.id)
        if e.preset not in presets:
            raise BundleError(f"{where}: entry {e.id} ({e.test}) names preset {e.preset}, which the manifest "
                              "does not describe.")
        inside(root, e.artifact, "artifact")
        inside(root, e.inputs, "inputs")
    return manifest


def _verdict(value: Any) -> str:
    """A left-out entry's verdict: one decided without outputs to compare (a bundle cannot
    carry a PASS, or any verdict of a comparison, for a test it holds no outputs of)."""
    from .verdicts import Verdict

    verdict = Verdict(str(value))
    if verdict in (Verdict.PASS, Verdict.MISMATCH, Verdict.SQNR_LOW, Verdict.NOT_DELEGATED):
        raise ValueError(f"a left-out entry cannot be {verdict.value}: it was never run")
    return verdict.value


def _entry(e: dict[str, Any]) -> Entry:
    def specs(values: Any) -> tuple[ArraySpec, ...]:
        out = []
        for v in values:
            shape = tuple(int(d) for d in v["shape"])
            if any(d < 0 for d in shape):
                raise ValueError(f"negative dimension in {shape}")
            if not _DTYPE.match(str(v["dtype"])):
                raise ValueError(f"dtype {v['dtype']!r}")
            out.append(ArraySpec(shape, str(v["dtype"])))
        return tuple(out)

    entry = Entry(str(e["id"]), str(e["test"]), int(e["seed"]), str(e["preset"]), str(e["family"]),
                  str(e["artifact"]), str(e["artifact_sha256"]), str(e["inputs"]), str(e["inputs_sha256"]),
                  specs(e["input_specs"]), specs(e["outputs"]), str(e["golden"]), str(e.get("compute_units") or ""),
                  str(e.get("calibration") or ""), str(e.get("bundled_program") or ""))
    if not _ENTRY_ID.match(entry.id):
        raise ValueError(f"entry id {entry.id!r} is not e<digits>")
    if not (_SHA.match(entry.artifact_sha256) and _SHA.match(entry.inputs_sha256)):
        raise ValueError(f"entry {entry.id}: a digest is not 64 hex digits")
    return entry


def read_arrays(path: Path, prefix: str, limit_bytes: int) -> list[np.ndarray]:
    """`prefix`0, `prefix`1, ... of an .npz file, in order; no pickled objects."""
    if not path.is_file() or path.is_symlink():
        raise BundleError(f"{path}: not a regular file.")
    if path.stat().st_size > limit_bytes:
        raise BundleError(f"{path}: over {limit_bytes >> 20} MiB, more than its manifest entry describes.")
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
            count = len(names)
            wanted = [f"{prefix}{i}" for i in range(count)]
            if set(wanted) != names:
                raise BundleError(f"{path}: holds {sorted(names)}; a bundle file holds {prefix}0..{prefix}{count - 1}.")
            return [np.asarray(npz[n]) for n in wanted]
    except BundleError:
        raise
    except (ValueError, OSError, EOFError) as exc:   # a damaged or non-.npz file, a pickled array
        raise BundleError(f"{path}: not an .npz file of plain arrays ({type(exc).__name__}: {exc}).") from None


def bytes_for(specs: tuple[ArraySpec, ...]) -> int:
    """A bound on an .npz holding arrays of these specs (any float dtype up to 8 bytes)."""
    return sum(8 * math.prod(s.shape) + 4096 for s in specs) + 65536


@dataclass(frozen=True)
class DeviceResult:
    """What a runner says of one entry: timings, or the stage that failed and why."""

    infer_ms_all: tuple[float, ...] = ()
    load_ms: float | None = None
    failed: str = ""       # "", "load" or "infer"
    error: str = ""
    error_class: str = ""


@dataclass(frozen=True)
class DeviceRecord:
    family: str
    environment: dict[str, Any]
    results: dict[str, DeviceResult]


def read_device(root: Path, family: str) -> DeviceRecord | None:
    """The record the family's runner wrote (None: it has not run)."""
    path = root / f"device-{family}.json"
    if not path.exists():
        return None
    data = read_json(path, "device record")
    try:
        env = {str(k): v for k, v in data["environment"].items()}
        results = {}
        for key, r in data["results"].items():
            times = tuple(float(t) for t in r.get("infer_ms_all") or ())
            if not all(math.isfinite(t) and t >= 0 for t in times):
                raise ValueError(f"entry {key}: a latency that is not a finite number >= 0")
            failed = str(r.get("failed") or "")
            if failed not in ("", "load", "infer"):
                raise ValueError(f"entry {key}: failed {failed!r}")
            load = r.get("load_ms")
            results[str(key)] = DeviceResult(times, None if load is None else float(load), failed,
                                             str(r.get("error") or "")[:4000], str(r.get("error_class") or "")[:200])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BundleError(f"{path}: not a device record a bundle runner writes "
                          f"({type(exc).__name__}: {exc}).") from None
    return DeviceRecord(family, env, results)
