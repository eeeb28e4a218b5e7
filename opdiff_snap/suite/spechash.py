"""The spec hash: what a golden's outputs depend on, and nothing else.

sha256 over the canonical JSON of a case definition minus the keys that do not
change outputs (tolerance, seeds, tags, skip), followed by the source text of every
`file:` module the case uses.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

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
        out[(suite_dir / rel).resolve()] = None
    return tuple(out)


def spec_hash(definition: Mapping[str, Any], source_files: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    body = {k: v for k, v in definition.items() if k not in NON_OUTPUT_KEYS}
    h.update(canonical_json(body).encode())
    for f in source_files:
        h.update(b"\0file\0")
        try:
            h.update(f.read_bytes())
        except OSError:
            h.update(b"\0missing\0")  # the golden then reads as stale rather than crashing
    return h.hexdigest()
