"""The suite files one command reads: each read once and parsed at most once, whoever asks
(discovery, loading, the goldens' vouching), failures included, so each asker reports them
as before. With a cache folder, discovery and loading take what they can from the
expansions kept there (suite/expanded_cache.py)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Callable

from .expanded_cache import SuiteCache
from .yamlload import MAX_DOCUMENT_BYTES, Mark, YamlSyntaxError, load_yaml_text, read_yaml_bytes, yaml_text


class SuiteReader:
    """Memoised reads of one command; `cache_folder`: the artifact cache's local folder, which
    keeps expansions under suites/ (None: nothing is kept); `warn`: how a tampered entry is
    told to the user (default: Python's warnings)."""

    def __init__(self, cache_folder: Path | None = None, warn: Callable[[str], None] | None = None):
        self.cache = SuiteCache(Path(cache_folder), self, warn) if cache_folder is not None else None
        self._data: dict[str, bytes | OSError] = {}
        self._parsed: dict[str, tuple[Any, list[tuple[str, Mark]]] | YamlSyntaxError | OSError] = {}
        self._digests: dict[str, str | None] = {}

    def data(self, path: Path) -> bytes:
        """The file's bytes (at most one past the most a suite may hold); raises OSError."""
        key = os.path.abspath(path)
        if key not in self._data:
            try:
                self._data[key] = read_yaml_bytes(Path(path))
            except OSError as exc:
                self._data[key] = exc
        found = self._data[key]
        if isinstance(found, OSError):
            raise found
        return found

    def parsed(self, path: Path) -> tuple[Any, list[tuple[str, Mark]]]:
        """(YAML value, duplicate-key problems); raises OSError or YamlSyntaxError."""
        key = os.path.abspath(path)
        if key not in self._parsed:
            try:
                self._parsed[key] = load_yaml_text(yaml_text(self.data(path)))
            except (OSError, YamlSyntaxError) as exc:
                self._parsed[key] = exc
        found = self._parsed[key]
        if isinstance(found, (OSError, YamlSyntaxError)):
            raise found
        return found

    def digest(self, path: Path | str) -> str | None:
        """sha256 of a regular file's bytes; None for anything else (missing, unreadable, a
        folder, a pipe)."""
        key = os.path.abspath(path)
        if key not in self._digests:
            data = self._data.get(key)
            if data is None and os.path.isfile(key):
                try:   # read as a suite is (kept for its parse), so it is read once
                    data = self.data(Path(key))
                except OSError:
                    del self._data[key]   # a reader of the file meets the failure itself
            if isinstance(data, bytes) and len(data) <= MAX_DOCUMENT_BYTES and os.path.isfile(key):
                self._digests[key] = hashlib.sha256(data).hexdigest()
            else:
                self._digests[key] = _file_digest(key)
        return self._digests[key]


def _file_digest(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)
