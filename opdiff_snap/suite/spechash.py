"""The spec hash: what a golden's outputs depend on, and nothing else.

sha256 over the canonical JSON of a case definition minus the keys that do not
change outputs (tolerance, seeds, tags, skip), followed by the source text of every
`file:` module the case uses.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator, Mapping

from .reads import note

NON_OUTPUT_KEYS = ("tolerance", "seeds", "tags", "skip")


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _paths(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("path", "target") and isinstance(v, str) and v.startswith("file:"):
                yield v
            else:
                yield from _paths(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _paths(v)


def file_modules(definition: Mapping[str, Any], suite_dir: Path) -> tuple[Path, ...]:
    """The resolved files of every `file:` path in a definition, first use first."""
    out: dict[Path, None] = {}
    for p in _paths(dict(definition)):
        rel = p[len("file:"):].partition("::")[0]
        note("resolve", suite_dir / rel)
        out[(suite_dir / rel).resolve()] = None
    return tuple(out)


def spec_hash(definition: Mapping[str, Any], source_files: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    body = {k: v for k, v in definition.items() if k not in NON_OUTPUT_KEYS}
    h.update(canonical_json(body).encode())
    for f in source_files:
        h.update(b"\0file\0")
        _hash_file(h, f)
    return h.hexdigest()


def _hash_file(h: Any, path: Path) -> None:
    """Stream a regular file into `h`. Anything else (missing, a device such as
    /dev/zero, a FIFO, a folder) hashes as a marker, so the golden reads as stale
    instead of the read never ending: a golden's definition chooses these paths."""
    note("read", path)
    try:
        # opened without blocking (a FIFO opens at once) and judged by what was opened, so a
        # file swapped for a pipe between a check and the open cannot block the read
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            h.update(b"\0not a regular file\0")
            return
        with open(fd, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        h.update(b"\0missing\0")
