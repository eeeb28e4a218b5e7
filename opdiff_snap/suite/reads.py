"""What expanding a suite looked at besides its own text, noted as it happens, so that a
cached expansion (suite/expanded_cache.py) is used only while all of it is unchanged.

An observation is a tuple: ("read", path) a file whose content decided something,
("probe", path) whether a path is a file, ("resolve", path) where a path leads through
symbolic links, ("spec", name) where a top-level package is found, ("walk", folder) every
file below a folder. Nothing is noted outside `noting()`.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterable, Iterator

Observation = tuple[str, str]

_current: ContextVar[list[Observation] | None] = ContextVar("suite_reads", default=None)


def note(kind: str, what: object) -> None:
    seen = _current.get()
    if seen is not None:
        seen.append((kind, str(what)))


def replay(observations: Iterable[Observation]) -> None:
    """Note again what an earlier, memoised look noted."""
    seen = _current.get()
    if seen is not None:
        seen.extend(observations)


@contextmanager
def noting() -> Iterator[list[Observation]]:
    """Collect what is noted inside the block (an enclosing `noting` sees none of it)."""
    seen: list[Observation] = []
    token = _current.set(seen)
    try:
        yield seen
    finally:
        _current.reset(token)
