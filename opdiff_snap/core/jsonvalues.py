"""JSON a user hands in (preset options, suite-cache entries), parsed within bounds.

A value nests at most MAX_NESTING levels (the suite loader's bound): a deeper one would
overflow the recursion of the parser or of whatever copies or writes it later, so it is
refused where it is parsed, with a message naming where it came from."""

from __future__ import annotations

import json
from typing import Any

from .errors import OpdiffError
from .limits import MAX_NESTING


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether `value` (lists, tuples and dicts) nests deeper than `limit` levels; no recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, (list, tuple)) else ()
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def nested_too_deep(where: str) -> OpdiffError:
    return OpdiffError(f"{where}: nested deeper than {MAX_NESTING} levels, the most allowed; flatten the value.")


def loads(text: str | bytes, where: str, hint: str = "") -> Any:
    """`text` parsed as JSON, nesting at most MAX_NESTING levels; an OpdiffError starting
    with `where` otherwise (`hint`: what to write instead)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise nested_too_deep(where) from None
    except (ValueError, TypeError) as exc:
        raise OpdiffError(f"{where}: not valid JSON ({exc}){'; ' + hint if hint else ''}.") from None
    if too_deep(value):
        raise nested_too_deep(where)
    return value


def loads_or_none(data: str | bytes, limit: int = MAX_NESTING) -> Any:
    """`data` parsed as JSON, or None where it is not JSON or nests deeper than `limit`."""
    try:
        value = json.loads(data)
    except (ValueError, TypeError, RecursionError):
        return None
    return None if too_deep(value, limit) else value
