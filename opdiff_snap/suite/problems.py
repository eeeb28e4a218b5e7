"""Where a problem in a suite is, the problems of one validation pass, and the checks
every validator shares.

Every check records a `Problem` and goes on, so one pass finds every problem;
a value that failed resolves to `BAD`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable

from ..core.errors import Problem, suggest
from .yamlload import Mark, child_mark, key_mark

BAD: Any = type("Bad", (), {"__repr__": lambda self: "BAD"})()  # a value that failed validation


@dataclass(frozen=True)
class Where:
    """A location in a suite: file, field path, YAML position and (when known) test id."""

    file: str
    field: str = ""
    mark: Mark = None
    test_id: str = ""

    def at(self, container: Any, key: Any) -> "Where":
        return replace(self, field=self._join(key), mark=child_mark(container, key, self.mark))

    def key(self, container: Any, key: Any) -> "Where":
        return replace(self, field=self._join(key), mark=key_mark(container, key, self.mark))

    def _join(self, key: Any) -> str:
        if isinstance(key, int):
            return f"{self.field}[{key}]"
        return f"{self.field}.{key}" if self.field else str(key)


class Problems:
    """Ordered, de-duplicated problems (template expansion meets the same one repeatedly)."""

    def __init__(self) -> None:
        self._items: dict[Problem, None] = {}

    def add(self, where: Where, message: str) -> Any:
        line, col = where.mark if where.mark else (None, None)
        self._items[Problem(file=where.file, message=message, field=where.field,
                            test_id=where.test_id, line=line, column=col)] = None
        return BAD

    def extend(self, problems: Iterable[Problem]) -> None:
        for p in problems:
            self._items[p] = None

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)


def check_keys(m: dict, allowed: Iterable[str], where: Where, problems: Problems, what: str) -> None:
    allowed = tuple(allowed)
    for k in m:
        if k not in allowed:
            problems.add(where.key(m, k), f"unknown key '{k}' in {what}{suggest(k, allowed)}; "
                                          f"valid keys: {', '.join(allowed)}")


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def plain(x: Any, where: Where, problems: Problems) -> Any:
    """A YAML literal as plain JSON (dict/list/str/number/bool/None)."""
    try:
        return _plain(x)
    except _NotPlain:
        return _plain_at(x, where, problems)


class _NotPlain(Exception):
    pass


_PLAIN_TYPES = (str, bool, int, float, type(None))


def _plain(x: Any) -> Any:
    """plain() of a value that is all plain, without a Where per element; _NotPlain else."""
    if isinstance(x, list):
        if all(type(v) in _PLAIN_TYPES for v in x):
            return list(x)
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, _PLAIN_TYPES):
        return x
    raise _NotPlain


def _plain_at(x: Any, where: Where, problems: Problems) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain_at(v, where.at(x, k), problems) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain_at(v, where.at(x, i), problems) for i, v in enumerate(x)]
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    return problems.add(where, f"{type(x).__name__} value {x!r} is not allowed here; quote it as a string")
