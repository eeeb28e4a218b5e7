"""The expectations file, parsed and validated, kept in the artifact cache's local folder:
a warm check reads its 10,000 entries back as JSON (tens of milliseconds) instead of
parsing and validating the YAML again (about half a second on 2 cores).

An entry is named by the SHA-256 of the file's text and a digest of what validation
depended on: the preset names known, the entry format, opdiff-snap's version and the
source of the modules that parse and validate. Only a file without problems is kept, so
a file with problems is parsed afresh and reports them exactly as before.

Like the suite cache, an entry is signed with this user's key (core/signing.py): one that
does not carry that signature, cannot be read or has another shape is ignored, the file
parsed afresh and the entry written again. Where there is no key, nothing is kept. One
entry is kept per set of presets: writing the entry of a new text removes the older ones.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from .. import __version__
from ..core.jsonvalues import loads_or_none
from ..core.regular_files import read_regular
from ..core.signing import signed, user_key, verified
from ..core.verdicts import Verdict
from ..storage.local import write_bytes_whole
from .entries import Expectation

FORMAT = 1
MAX_ENTRY_BYTES = 64 << 20
FIELDS = ("preset", "test", "verdict", "reason", "seed", "until", "line")


_HERE = Path(__file__).resolve().parent
SOURCES = (_HERE / "file.py", _HERE / "entries.py", _HERE.parent / "suite" / "yamlload.py")   # parse and validate


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    h = hashlib.sha256(f"{FORMAT}\0{__version__}".encode())
    for source in SOURCES:
        h.update(source.read_bytes())
    return h.hexdigest()


def entry_path(folder: Path, text_digest: str, presets: Sequence[str]) -> Path:
    key = hashlib.sha256(json.dumps([_code_digest(), sorted(presets)]).encode()).hexdigest()[:32]
    return folder / "expectations" / f"{text_digest}-{key}.json"


def read(folder: Path, text_digest: str, presets: Sequence[str]) -> list[Expectation] | None:
    """The entries kept for this text and these presets, or None."""
    data = read_regular(entry_path(folder, text_digest, presets), MAX_ENTRY_BYTES)
    key = user_key() if data is not None else None
    body = verified(key, data) if data is not None and key is not None else None
    rows = loads_or_none(body, 8) if body is not None else None
    if not isinstance(rows, list):
        return None
    try:
        return [_entry(row) for row in rows]
    except (TypeError, ValueError, KeyError):
        return None


def write(folder: Path, text_digest: str, presets: Sequence[str], entries: Sequence[Expectation]) -> None:
    """Keep `entries` (a file's, validated without problems); a folder that cannot be
    written only costs the speed-up."""
    key = user_key()
    if key is None:
        return
    body = json.dumps([[e.preset, e.test, e.verdict.value, e.reason, e.seed, e.until, e.line] for e in entries],
                      separators=(",", ":")).encode()
    path = entry_path(folder, text_digest, presets)
    if write_bytes_whole(path, signed(key, body)):
        for older in path.parent.glob(f"*-{path.name.split('-', 1)[1]}"):   # earlier texts: never read again
            if older != path:
                older.unlink(missing_ok=True)


def _entry(row: Any) -> Expectation:
    preset, test, verdict, reason, seed, until, line = row
    if not (isinstance(preset, str) and isinstance(test, str) and isinstance(reason, str)
            and isinstance(until, str) and (seed is None or type(seed) is int)
            and (line is None or type(line) is int)):
        raise TypeError("an entry of another shape")
    return Expectation(preset, test, Verdict(verdict), reason, seed, until, line)
