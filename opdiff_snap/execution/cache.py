"""On-disk cache of exported artifacts, for backends that serialise (`serializes = True`).

Layout: `<cache_dir>/<key[:2]>/<key>/` holding the backend's workdir under `work/`,
`entry.json` (original export time, where the artifact sits in `work/`, who made it)
and an empty `complete` marker written last. An entry is built in a temporary sibling
directory and renamed into place, so a killed export leaves no entry that looks
complete; an entry without the marker, or one whose files do not load, is removed and
rebuilt.

The key is sha256 over: test id and spec hash, seed, the resolved preset, a digest of
the module weights that export bakes in (a re-recorded golden with new weights must
not reuse an old artifact), and the versions of torch, of the backend's runtime
packages and of opdiff-snap.

A cache behind an s3:// URL is shared: the same entries, as objects under
`<key[:2]>/<key>/` with `complete` written last, behind a local folder
(storage.local_copy_dir) that loads them (storage/shared.py). A lookup that misses locally downloads a
complete remote entry; a new export is uploaded once it is published locally. The key is
the same as a local cache's, so a runner re-checking unchanged goldens downloads
artifacts instead of exporting them, and never gets one exported for anything else.
A remote that fails mid-way only costs the cache: the lookup misses, the upload is
skipped, the artifact is used from the local folder.

Deterministic failures are kept under the same key: an export or a load that raised
(EXPORT_FAIL, LOAD_FAIL) writes `failures/<key[:2]>/<key>.json` in the local folder with
its verdict and message, and the next job with that key is answered from it without
exporting (its outcome has `cache_hit`). The key holds everything that decides the
answer (spec hash, weights, inputs' shapes, preset options, library versions), so a new
version or a changed test asks again; a timeout or a crash never gets here (the pool
decides those), and neither does an error of the machine (out of memory, an OSError) or
one of this tool's own code (a plain Python error raised in opdiff_snap: `own_bug`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from .. import __version__
from ..backends.base import Artifact, Delegation, Preset
from ..core import trees
from ..core.errors import OpdiffError
from ..storage import StorageError, occupied_by_file, open_tiers
from ..suite import dynamic
from ..suite.model import Invocation, TestCase
from ..suite.spechash import spec_hash


class Subject(Protocol):
    """What a cache key is made of (a runner.Job is one)."""

    case: TestCase
    seed: int
    invocation: Invocation | None
    preset: Preset


MARKER, ENTRY = "complete", "entry.json"
ENTRY_MAX_BYTES = 1 << 16
MESSAGE_MAX = 20_000     # of a remembered error message

# The packages whose versions can change what an export produces, by backend family.
RUNTIME_PACKAGES = {
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
    "executorch": ("executorch", "torchao"),   # torchao: the PT2E quantizer of the int8 presets
    "coreml": ("coremltools",),
}


@functools.lru_cache(maxsize=None)   # a worker's packages do not change under it; asking costs ms
def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _invocation(job: Subject) -> Any:
    assert job.invocation is not None, "an artifact is keyed by the invocation it was exported for"
    return job.invocation


def _states_digest(job: Subject) -> str:
    import torch

    h = hashlib.sha256()
    states = _invocation(job).states
    for side in sorted(states):
        for name, t in sorted(states[side].items()):
            t = t.detach().cpu().contiguous().reshape(-1)
            h.update(f"{side}/{name}/{t.dtype}/{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _inputs_signature(job: Subject, ranks_only: bool = False) -> Any:
    """What export bakes in besides the weights: every non-tensor argument, and the
    shapes and dtypes of the tensor ones (artifacts are exported for static shapes; a
    sized test's are not, and its definition's shapes stand in)."""
    invocation = _invocation(job)
    structure, leaves = trees.flatten((list(invocation.args), dict(invocation.kwargs)))
    return [structure, [[str(t.dtype), t.dim() if ranks_only else list(t.shape)] for t in leaves]]


def runtime_versions(preset: Preset) -> dict[str, str]:
    """The versions that can change what exporting for `preset` produces."""
    import torch

    return {"torch": torch.__version__, "opdiff_snap": __version__,
            **{p: _version(p) for p in RUNTIME_PACKAGES.get(preset.family, ())}}


def cache_key(job: Subject) -> str:
    """The key of a job's artifact: what its export depends on. The sized tests of one
    test (dynamic shapes) share one key, so one export serves them all."""
    case = job.case
    material = {
        "test": case.id,
        "spec_hash": case.spec_hash,
        "definition": case.definition if not case.spec_hash else None,
        "seed": job.seed,
        "preset": {"name": job.preset.name, **job.preset.to_json()},
        "states": _states_digest(job),
        "inputs": _inputs_signature(job),
        "versions": runtime_versions(job.preset),
        "layout": 2,   # what an entry holds beside the artifact (2: ExecuTorch's delegation.json)
    }
    if case.dynamic is not None:
        material.update(test=dynamic.seed_id(case.id, case.definition) + "@dynamic",
                        spec_hash=spec_hash(dynamic.group_definition(case.definition), case.source_files),
                        definition=None, inputs=_inputs_signature(job, ranks_only=True))
    blob = json.dumps(material, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass
class CacheEntry:
    key: str
    path: Path                # <cache_dir>/<key[:2]>/<key>
    export_ms: float | None   # the original export time, kept for history

    artifact_rel: str | None = None   # where in work/ the artifact sits (entry.json's `artifact`)
    batch: int | None = None          # made by one exporter call for this many tests (None: alone)

    def artifact(self) -> Artifact:
        rel = self.artifact_rel
        return Artifact(path=self.path / "work" / rel if rel else self.path / "work")


def read_entry(path: Path) -> dict[str, Any] | None:
    """An entry's entry.json, when it is what `store` writes: a mapping whose export time
    is a number and whose artifact is a relative path inside work/. None otherwise (the
    entry is then rebuilt)."""
    try:
        if path.stat().st_size > ENTRY_MAX_BYTES:
            return None
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    ms, rel = meta.get("export_ms"), meta.get("artifact")
    if ms is not None and (not isinstance(ms, (int, float)) or isinstance(ms, bool)):
        return None
    if rel is not None and (not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts):
        return None
    batch = meta.get("batch")
    if batch is not None and (not isinstance(batch, int) or isinstance(batch, bool) or batch < 2):
        return None
    return meta


def cache_unusable(root: Path | str) -> str | None:
    """Why artifacts cannot be cached under `root` (None when they can). Raises
    OpdiffError when `root` is a file. Creates nothing: a missing folder is judged by
    the nearest folder above it that exists. A cache shared behind a URL is probed with one
    small object written and deleted, and its local folder judged the same way."""
    try:
        tiers = open_tiers(root)
        tiers.probe()
    except StorageError as exc:
        return str(exc)
    root = tiers.root
    if occupied_by_file(root):
        raise OpdiffError(f"the artifact cache {root} is a file, not a folder: point --cache (or "
                          "[tool.opdiff] cache) at a folder (default ./.opdiff-cache), or pass --no-cache.")
    if root.is_dir():
        try:
            fd, probe = tempfile.mkstemp(prefix=".probe-", dir=root)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return exc.strerror or str(exc)
        return None
    parent = next((d for d in root.absolute().parents if d.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable, so {root} cannot be created"
    return None


@dataclass
class FailureRecord:
    """A deterministic failure of one cache key, as it happened the first time."""

    verdict: str                      # EXPORT_FAIL or LOAD_FAIL
    error_class: str | None
    error_message: str | None
    delegation: dict[str, Any] | None = None   # Delegation.to_json(), for a LOAD_FAIL
    survey: dict[str, Any] | None = None       # what check's survey of the test's ops found

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> FailureRecord:
        """A record as stored, checked like golden data: ValueError when it is not what
        `remember_failure` writes (the cache then asks the backend again)."""
        if not isinstance(data, dict) or data.get("verdict") not in ("EXPORT_FAIL", "LOAD_FAIL"):
            raise ValueError("not a failure record")
        texts = [data.get(k) for k in ("error_class", "error_message")]
        if not all(t is None or isinstance(t, str) for t in texts):
            raise ValueError("a failure record's error is not text")
        delegation, survey = data.get("delegation"), data.get("survey")
        if delegation is not None:
            Delegation.from_json(delegation)      # raises ValueError when it is not evidence
        if survey is not None and not isinstance(survey, dict):
            raise ValueError("a failure record's survey is not a mapping")
        message = texts[1] if texts[1] is None or len(texts[1]) <= MESSAGE_MAX else texts[1][:MESSAGE_MAX] + " [...]"
        return cls(data["verdict"], texts[0], message, delegation, survey)


_PACKAGE = Path(__file__).resolve().parents[1]   # opdiff_snap/


def deterministic(exc: BaseException) -> bool:
    """Whether an export or load error says something lasting about the inputs: not when
    the machine ran out of memory or a file or socket failed, nor when it is a bug of this
    tool (a plain Python error raised in opdiff_snap's own code, which its next edit may
    fix: remembered, it would outlive the fix, since the key holds no code of ours)."""
    return not isinstance(exc, (MemoryError, OSError)) and not own_bug(exc)


def own_bug(exc: BaseException) -> bool:
    """A built-in exception (AttributeError, TypeError, ...) whose innermost frame is in
    this package: not a backend's answer but a fault of the code that asks it."""
    if type(exc).__module__ != "builtins":
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    try:
        return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)
    except (OSError, ValueError):
        return False


class ArtifactCache:
    def __init__(self, root: Path | str):
        self.tiers = open_tiers(root)   # a cache behind a URL: a local folder in front of it
        self.root = self.tiers.root

    def entry_dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def lookup(self, key: str) -> CacheEntry | None:
        """The complete entry for `key`, or None (an incomplete one is removed)."""
        path = self.entry_dir(key)
        if not path.exists() and not self.tiers.fetch(_name(key), MARKER):
            return None
        meta = read_entry(path / ENTRY) if (path / MARKER).is_file() else None
        if meta is not None:
            return CacheEntry(key, path, meta.get("export_ms"), meta.get("artifact"), meta.get("batch"))
        self.evict(key, shared=False)
        return None

    def settled(self, key: str) -> bool:
        """Whether `key` needs no export: its artifact, or its failure, is kept."""
        return self.lookup(key) is not None or self.failure(key) is not None

    def made_by_batch(self, key: str) -> bool:
        """Whether the artifact kept for `key` came from a batch (execution/batch.py)."""
        entry = self.lookup(key)
        return entry is not None and bool(entry.batch)

    def _failure_path(self, key: str) -> Path:
        return self.root / "failures" / key[:2] / f"{key}.json"

    def failure(self, key: str) -> FailureRecord | None:
        """The failure remembered for `key`, or None (an unreadable record is ignored)."""
        try:
            return FailureRecord.from_json(json.loads(self._failure_path(key).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def remember_failure(self, key: str, record: FailureRecord) -> None:
        """Write (or replace) the record atomically; a cache that cannot be written costs
        only the next run's time."""
        path = self._failure_path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
            tmp.write_text(json.dumps(record.to_json(), default=str))
            os.replace(tmp, path)
        except OSError:
            pass

    def _hint_path(self, job: Subject) -> Path:
        name = hashlib.sha256(f"{job.case.id}\0{job.seed}\0{job.preset.name}".encode()).hexdigest()
        return self.root / "failures" / "tests" / name[:2] / name

    def failed_before(self, job: Subject) -> bool:
        """Whether `job`'s test failed to export or load on its preset at some earlier time,
        whatever the library versions were then (a batch leaves it out: it would likely
        fail the batch again)."""
        return self._hint_path(job).is_file()

    def note_failed(self, job: Subject, failed: bool) -> None:
        """Keep (or drop) the hint that `job`'s test fails to export or load on its preset."""
        path = self._hint_path(job)
        try:
            if failed:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass

    def evict(self, key: str, shared: bool = True) -> None:
        """Remove an entry (one that does not load: from the shared cache too)."""
        if shared:
            self.tiers.drop(_name(key), MARKER)
        path = self.entry_dir(key)
        if path.exists():
            trash = path.with_name(f".trash-{key}-{uuid.uuid4().hex[:8]}")
            try:
                path.rename(trash)  # atomic: readers never see half a deletion
            except OSError:
                return
            shutil.rmtree(trash, ignore_errors=True)

    @contextlib.contextmanager
    def exclusive(self, key: str) -> Iterator[None]:
        """Hold `key` against the other processes on this machine that ask for it: the
        sized tests of one test share a key, and one export makes their artifact while
        the others wait for it. (Where file locks are not to be had, nothing is held.)"""
        try:
            import fcntl
        except ImportError:   # not POSIX
            yield
            return
        path = self.root / "locks" / key[:2] / key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a")
        except OSError:
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def scratch(self) -> Iterator[Path]:
        """A folder on the cache's own disk, removed afterwards: what is built there moves
        into an entry by renaming (hard links between entries stay links)."""
        folder = self.tiers.local.stage("scratch")
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def store(self, key: str, export: Callable[[Path], Artifact], info: dict[str, Any],
              export_ms: float | None = None) -> tuple[CacheEntry, float]:
        """Run `export(workdir)` into a staging directory, time it, and publish the entry.

        Returns the entry and the export time in ms (`export_ms` when given: what an
        artifact exported elsewhere cost, its `export` only moving it in). If another
        process published the same key meanwhile, its entry is used and ours discarded."""
        final = self.entry_dir(key)
        staging = self.tiers.local.stage(_name(key))
        try:
            work = staging / "work"
            work.mkdir()
            t0 = time.perf_counter()
            artifact = export(work)
            if export_ms is None:
                export_ms = (time.perf_counter() - t0) * 1e3
            rel = None
            if artifact.path is not None:
                resolved = Path(artifact.path).resolve()
                try:
                    rel = str(resolved.relative_to(work.resolve()))
                except ValueError:
                    raise RuntimeError(f"the backend wrote its artifact outside its workdir "
                                       f"({resolved}); it cannot be cached") from None
                rel = None if rel == "." else rel
            meta = {"key": key, "export_ms": export_ms, "artifact": rel, "created": time.time(), **info}
            (staging / "entry.json").write_text(json.dumps(meta, indent=1, default=str))
            (staging / "complete").write_text("")
            if not self.tiers.local.publish_dir(_name(key), staging):
                entry = self.lookup(key)   # published by someone else meanwhile
                if entry is None:
                    raise OpdiffError(f"the artifact cache entry {final} vanished while it was published; "
                                      "run again.")
                return entry, export_ms
            self.tiers.share(_name(key), MARKER)   # its files first, `complete` last
            return CacheEntry(key, final, export_ms, rel, info.get("batch")), export_ms
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def holds_artifacts_of(root: Path | str, preset: str) -> bool:
    """Whether the cache's local folder holds an artifact exported for `preset` (a run whose
    jobs will mostly load rather than export needs no warm-up export)."""
    try:
        folder = open_tiers(root).root
        for entry in folder.glob("*/*/entry.json"):
            meta = read_entry(entry)
            if meta is not None and meta.get("preset") == preset:
                return True
    except (OSError, StorageError):
        pass
    return False


def _name(key: str) -> str:
    """An entry's name in the cache: `<key[:2]>/<key>`."""
    return f"{key[:2]}/{key}"
