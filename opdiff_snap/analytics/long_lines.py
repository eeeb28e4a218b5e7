"""Run-file lines past the history's line bound, kept from the reader.

No line opdiff writes is longer than MAX_HISTORY_LINE_BYTES (history/writer.py), but a
run file is data anyone with the store can edit or bring from elsewhere, and DuckDB stops
the whole load at a line beyond its object size. Only a file larger than the bound can
hold such a line; it is scanned in pieces, and read through a copy whose over-long lines
are each one `{"type": "oversized"}` line, so every other line keeps its number and the
load names the skipped one in a warning."""

from __future__ import annotations

import os
import tempfile

from ..core.limits import MAX_HISTORY_LINE_BYTES

MARKER = b'{"type": "oversized"}\n'
_PIECE = 1 << 20


def _lines(f, limit: int):
    """Each line of `f` (with its newline), or None for one longer than `limit` bytes; read
    in pieces, so an over-long line is never held whole."""
    held, over = bytearray(), False
    while piece := f.read(_PIECE):
        start = 0
        while True:
            end = piece.find(b"\n", start)
            if not over:
                held += piece[start:end + 1 if end >= 0 else len(piece)]
                if len(held) - (end >= 0) > limit:
                    held, over = bytearray(), True
            if end < 0:
                break
            yield None if over else bytes(held)
            held, over, start = bytearray(), False, end + 1
    if held or over:
        yield None if over else bytes(held)


def readable_copies(files: list[str], sizes: dict[str, int], folder: str,
                    limit: int = MAX_HISTORY_LINE_BYTES) -> dict[str, str]:
    """{copy: original} for each of `files` that holds a line longer than `limit` (only a
    file larger than `limit` can): the copy, written under `folder`, has each such line
    replaced by MARKER."""
    out: dict[str, str] = {}
    for name in files:
        if sizes.get(name, 0) <= limit:
            continue
        with open(name, "rb") as f:
            if all(line is not None for line in _lines(f, limit)):
                continue
        fd, copy = tempfile.mkstemp(suffix=".jsonl", dir=folder)
        with open(name, "rb") as f, os.fdopen(fd, "wb") as out_file:
            for line in _lines(f, limit):
                out_file.write(MARKER if line is None else line)
        out[copy] = name
    return out
