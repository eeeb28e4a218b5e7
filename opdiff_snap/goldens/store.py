"""GoldenStore: a directory that is a Zarr v3 group, one child array per (test id, seed).

Writes are atomic: a golden is built in `<root>/.staging/` and renamed into place, so a
reader sees a whole golden or none, and a writer killed at any point leaves at most
debris under `.staging/` (ignored, removed once its writer is gone). Overwriting renames
the old golden into `<root>/.trash/` first, renames the new one in, then deletes the old.
Nothing is fsynced: the store survives killed processes, not power loss mid-write.
A write that fails (disk full, read-only store) removes its staging and raises
GoldenWriteError; goldens already in place are never touched by a failed write.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .encode import FORMAT, MARK, decode, encode, info_from_attrs, tensor_records
from .packed import META, PackError, pack, read_data, read_metadata, unpack, write_packed
from .keys import seed_of_key, store_key
from ..errors import OpdiffError
from .model import CorruptGolden, Golden, GoldenInfo, MissingGolden
from .validate import definition_findings, problems as metadata_problems

STAGING, TRASH = ".staging", ".trash"
ROOT_ATTRS = {"opdiff_snap_goldens": {"format": FORMAT, "layout": "docs/goldens-layout.md"}}
DEBRIS_MAX_AGE_S = 3600.0


class GoldenWriteError(OpdiffError):
    """The store could not be written (disk full, read-only, not a folder); what was
    already recorded is untouched."""


@dataclass(frozen=True)
class Finding:
    """One thing verification says about one golden: `kind` is CORRUPT (check will not
    compare it), STALE (its spec hash does not match its definition and modules as they
    are now) or UNCHECKED (its spec hash could not be checked from here)."""

    info: GoldenInfo
    kind: str
    message: str


class GoldenStore:
    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._ready = False
        if self.root.exists() and not self.root.is_dir():
            raise OpdiffError(f"the golden store {self.root} is a file, not a folder: point --goldens "
                              "(or [tool.opdiff] goldens) at the folder that holds the goldens "
                              "(default ./goldens).")

    # ------------------------------------------------------------------ queries

    def exists(self) -> bool:
        return (self.root / META).is_file()

    def key(self, test_id: str, seed: int) -> str:
        return store_key(test_id, seed)

    def info(self, test_id: str, seed: int) -> GoldenInfo | None:
        """Metadata only; None when there is no golden. Unreadable metadata gives an info
        with `problem` set (and an empty spec hash, so record sees it as stale)."""
        key = store_key(test_id, seed)
        if not (self.root / key).is_dir():
            return None
        try:
            attrs = self._attrs(key, test_id, seed)
            return info_from_attrs(attrs, key)
        except CorruptGolden as exc:
            return GoldenInfo(test_id, seed, "", "", "", "", {}, "", key, problem=exc.reason)
        except (KeyError, TypeError, ValueError) as exc:
            return GoldenInfo(test_id, seed, "", "", "", "", {}, "", key,
                              problem=f"malformed attributes ({exc!r})")

    def index(self) -> list[GoldenInfo]:
        """Every golden, sorted by test id then seed. Goldens whose metadata cannot be read
        are included with `problem` set and whatever id could be recovered."""
        infos = []
        for key in self._keys():
            try:
                infos.append(info_from_attrs(self._attrs(key), key))
            except (CorruptGolden, KeyError, TypeError, ValueError) as exc:
                reason = exc.reason if isinstance(exc, CorruptGolden) else f"malformed attributes ({exc!r})"
                infos.append(self._recovered_info(key, reason))
        return sorted(infos, key=lambda i: (i.test_id, i.seed))

    def read(self, test_id: str, seed: int) -> Golden:
        """The whole golden, every array checked (crc32c and sha256); raises MissingGolden
        or CorruptGolden."""
        key = store_key(test_id, seed)
        if not (self.root / key).is_dir():
            raise MissingGolden(test_id, seed, self.root)
        path = self.root / key
        meta = self._metadata(key, test_id, seed)
        attrs = meta["attributes"]
        shape = meta.get("shape")
        nbytes = shape[0] if isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) else None
        found = metadata_problems(attrs, nbytes)
        if found:
            more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
            raise CorruptGolden(test_id, seed, "", "; ".join(found[:3]) + more, path / META)
        try:
            info_from_attrs(attrs, key)
            records = tensor_records(attrs)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptGolden(test_id, seed, "", f"malformed attributes ({exc})", path / META) from None
        try:
            data = read_data(path, meta)
            tensors = unpack(data, records)
        except PackError as exc:
            array = next((n for n in records if f"'{n}'" in str(exc)), "")
            raise CorruptGolden(test_id, seed, array, str(exc), path) from None
        try:
            return decode(attrs, tensors)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorruptGolden(test_id, seed, "", "its attributes do not match its tensors "
                                f"({type(exc).__name__}: {exc})", path / META) from None

    def read_definition(self, test_id: str, seed: int) -> dict[str, Any]:
        """The expanded test definition stored with the golden (metadata only)."""
        key = store_key(test_id, seed)
        if not (self.root / key).is_dir():
            raise MissingGolden(test_id, seed, self.root)
        definition = self._attrs(key, test_id, seed).get("definition")
        if not isinstance(definition, dict):
            raise CorruptGolden(test_id, seed, "", "the stored test definition is missing",
                                self.root / key / META)
        return definition

    def verify(self, test_id: str | None = None, *, definitions: bool = True) -> list[tuple[GoldenInfo, str]]:
        """(info, problem) for every golden (or those of one test) that check would call
        CORRUPT. With `definitions`, each stored definition is also rebuilt and hashed."""
        return [(f.info, f.message) for f in self.findings(test_id, definitions=definitions)
                if f.kind == "CORRUPT"]

    def findings(self, test_id: str | None = None, *, definitions: bool = True) -> list[Finding]:
        """Everything verification says about the goldens: every reason `read` refuses
        one and, with `definitions`, what rebuilding its definition says (see Finding)."""
        out = []
        for info in self.index():
            if test_id is not None and info.test_id != test_id:
                continue
            if info.problem:
                out.append(Finding(info, "CORRUPT", info.problem))
                continue
            expected = store_key(info.test_id, info.seed)
            if info.key != expected:
                out.append(Finding(info, "CORRUPT", f"stored under {info.key}, but its id belongs under {expected}"))
                continue
            try:
                golden = self.read(info.test_id, info.seed)
            except CorruptGolden as exc:
                out.append(Finding(info, "CORRUPT", exc.reason))
                continue
            if definitions:
                found = definition_findings(golden.test_id, golden.definition, golden.suite, golden.spec_hash,
                                            golden.test_type)
                out += [Finding(info, "CORRUPT", m) for m in found.problems]
                out += [Finding(info, "STALE", m) for m in found.stale]
                out += [Finding(info, "UNCHECKED", m) for m in found.unchecked]
        return out

    def check_writable(self) -> None:
        """Raise GoldenWriteError unless goldens can be written here (creates the store)."""
        try:
            self._ensure_root()
            probe = self.root / STAGING / _unique("probe")
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            raise GoldenWriteError(f"cannot write to the golden store {self.root} ({_why(exc)}). "
                                   "Make it writable, or point --goldens at a writable folder; nothing "
                                   "was recorded.") from None

    # ------------------------------------------------------------------ writes

    def write(self, golden: Golden) -> str:
        """Store `golden` atomically, replacing any golden of the same (test id, seed).
        Returns its key."""
        try:
            self._ensure_root()
        except OSError as exc:
            raise self._write_error(golden, exc) from None
        key = store_key(golden.test_id, golden.seed)
        attrs, named = encode(golden)
        records, data = pack(named)
        attrs["tensors"] = {name: rec.to_json() for name, rec in records.items()}
        stage = self.root / STAGING / _unique(key)
        try:
            stage.mkdir()
            try:
                write_packed(stage, attrs, data)
                self._publish(stage, key)
            except BaseException:
                shutil.rmtree(stage, ignore_errors=True)
                raise
        except OSError as exc:
            raise self._write_error(golden, exc) from None
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
        if not (self.root / key).is_dir():
            raise MissingGolden(test_id, seed, self.root)
        self._remove(key)

    def delete_key(self, key: str) -> None:
        """Delete by store key (GoldenInfo.key): works for goldens whose metadata, and so
        whose test id, cannot be read."""
        if "/" in key or key.startswith(".") or not (self.root / key).is_dir():
            raise OpdiffError(f"{self.root}: no golden under key '{key}'.")
        self._remove(key)

    def clean_debris(self, max_age_s: float = DEBRIS_MAX_AGE_S) -> int:
        """Remove staging and trash left by writers that died (their process is gone on this
        host, or the debris is older than `max_age_s`). Returns how many entries went."""
        removed = 0
        now = time.time()
        for sub in (STAGING, TRASH):
            try:
                entries = list(os.scandir(self.root / sub))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.name == META or entry.name.startswith(f".{META}."):
                    continue
                pid = _pid_of(entry.name)
                try:
                    old = now - entry.stat(follow_symlinks=False).st_mtime > max_age_s
                except FileNotFoundError:
                    continue
                if old or (pid is not None and not _alive(pid)):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed += 1
        return removed

    # ------------------------------------------------------------------ internals

    def _ensure_root(self) -> None:
        """Create the root group; safe when several writers do it at once."""
        if self._ready:
            return
        for sub, attrs in (("", ROOT_ATTRS), (STAGING, {}), (TRASH, {})):
            # .staging and .trash are (empty) groups too, so zarr lists the root cleanly
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            if not (self.root / sub / META).is_file():
                _write_json(self.root / sub / META, {"zarr_format": 3, "node_type": "group", "attributes": attrs})
        self.clean_debris()
        self._ready = True

    def _publish(self, stage: Path, key: str) -> None:
        final = self.root / key
        for _ in range(20):
            try:
                os.rename(stage, final)
                return
            except OSError:
                if not final.exists():
                    raise
            trash = self.root / TRASH / _unique(key)
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                continue  # another writer moved it first; try again
            try:
                os.rename(stage, final)
            finally:
                shutil.rmtree(trash, ignore_errors=True)
            return
        raise OSError(f"could not move the golden {key} into {self.root} after 20 tries")

    def _remove(self, key: str) -> None:
        trash = self.root / TRASH / _unique(key)
        try:
            (self.root / TRASH).mkdir(parents=True, exist_ok=True)
            os.rename(self.root / key, trash)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise GoldenWriteError(f"cannot delete the golden {key} from the golden store {self.root} "
                                   f"({_why(exc)}); it is still there, unchanged.") from None
        shutil.rmtree(trash, ignore_errors=True)

    def _keys(self) -> list[str]:
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OpdiffError(f"cannot list the golden store {self.root} ({_why(exc)}); check --goldens "
                              "and its permissions.") from None
        return [e.name for e in entries if seed_of_key(e.name) is not None and e.is_dir()]

    def _attrs(self, key: str, test_id: str | None = None, seed: int | None = None) -> dict[str, Any]:
        return self._metadata(key, test_id, seed)["attributes"]

    def _metadata(self, key: str, test_id: str | None = None, seed: int | None = None) -> dict[str, Any]:
        """The golden array's zarr.json; raises CorruptGolden if unreadable or if they
        name another (test id, seed) than asked."""
        path = self.root / key / META
        tid = test_id if test_id is not None else f"<unknown: {key}>"
        sd = seed if seed is not None else (seed_of_key(key) or 0)
        try:
            meta = read_metadata(self.root / key)
        except FileNotFoundError:
            raise CorruptGolden(tid, sd, "", f"{META} is missing", path) from None
        except OSError as exc:
            raise CorruptGolden(tid, sd, "", f"{META} is unreadable ({exc})", path) from None
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
        return GoldenInfo(f"<unknown: {key}>", seed_of_key(key) or 0, "", "", "", "", {}, "", key,
                          problem=problem)


def _write_json(path: Path, obj: Any) -> None:
    """Write a JSON file atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.{_unique('tmp')}")
    text = json.dumps(obj, separators=(",", ":"))
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _why(exc: OSError) -> str:
    return f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else (exc.strerror or str(exc))


def _unique(prefix: str) -> str:
    return f"{prefix}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _pid_of(name: str) -> int | None:
    parts = name.rsplit(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
