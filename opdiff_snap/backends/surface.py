"""The surface `Backend` declares, as tables: the members every backend defines itself and
those it may leave out (Backend's value is the default), the check of a plugin's object
against them, and `PluginBackend`, which gives a plain object the declared defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .base import REQUIRED_METHODS, Backend

REQUIRED: tuple[str, ...] = (*(name for name in Backend.__annotations__ if name not in vars(Backend)),
                             *REQUIRED_METHODS)
"""The members every backend defines itself, in the order of the declaration."""

STANDS_IN: Mapping[str, str] = {"export": "export_dynamic"}
"""A required method Backend defines through an optional one: a backend that defines the
optional one has it (`export` is `export_dynamic` with no axis dynamic)."""


@dataclass(frozen=True)
class _Kind:
    """What an optional member must be, told by its default in Backend; `yes_no`: a method
    whose answer is a yes or a no (a plugin's is read as a bool)."""

    name: str
    accepts: Callable[[Any], bool]
    yes_no: bool = False


def _kind_of(default: Any) -> _Kind:
    if callable(default):
        return _Kind("a method", callable, yes_no=default.__annotations__.get("return") == "bool")
    if isinstance(default, Mapping):
        return _Kind("a mapping", lambda value: isinstance(value, Mapping))
    return _Kind("a string", lambda value: isinstance(value, str))


OPTIONAL: dict[str, _Kind] = {name: _kind_of(default) for name, default in vars(Backend).items()
                              if not name.startswith("_") and name not in REQUIRED}
"""The members a backend may leave out (Backend's value is the default), and what each must be."""

PROMISES: Mapping[str, Callable[[Backend], bool]] = {
    "batches": lambda backend: backend._has("export_batch"),
    "quantizes": lambda backend: backend._has("export_quantized") or backend._halves(),
}
"""Optional members whose answer promises others: a plugin's counts only where it defines those."""


def _own(obj: Any, name: str) -> bool:
    """Whether `obj` has the method `name` of its own (not Backend's, not set to None)."""
    return getattr(obj, name, None) is not None and getattr(type(obj), name, None) is not vars(Backend)[name]


def _defines(obj: Any, name: str) -> bool:
    """Whether `obj` has the required member `name` (of its own where Backend's is a method),
    or the optional one that stands in for it."""
    if name in STANDS_IN and _own(obj, STANDS_IN[name]):
        return True
    if not hasattr(obj, name):
        return False
    return name not in REQUIRED_METHODS or getattr(type(obj), name, None) is not vars(Backend)[name]


def surface_problem(obj: Any) -> str:
    """What `obj` lacks of the declared surface, or has of the wrong kind ("": nothing).
    On an object that does not subclass Backend, an optional member set to None counts as
    left out (PluginBackend gives it the default)."""
    missing = [name for name in REQUIRED if not _defines(obj, name)]
    if missing:
        return f"it loaded a {type(obj).__name__}, which lacks {', '.join(missing)} of the Backend protocol"
    for name in REQUIRED_METHODS:
        if hasattr(obj, name) and not callable(getattr(obj, name)):
            return f"its '{name}' must be a method, not {type(getattr(obj, name)).__name__}"
    for name, kind in OPTIONAL.items():
        value = getattr(obj, name, None)
        if value is None and not isinstance(obj, Backend):
            continue
        if not kind.accepts(value):
            return f"its '{name}' must be {kind.name} (see backends/base.py), not {type(value).__name__}"
    return ""


class PluginBackend(Backend):
    """A plugin's backend object that does not subclass Backend, seen as one: its own
    members where it defines them, Backend's defaults where it does not (or sets None).
    Made by the registry once `surface_problem` found nothing wrong with it."""

    def __init__(self, plugin: Any):
        self.plugin = plugin
        self.defined = frozenset(name for name in OPTIONAL if getattr(plugin, name, None) is not None)
        for name in REQUIRED:
            if hasattr(plugin, name):
                setattr(self, name, getattr(plugin, name))
        for name in self.defined:
            if PROMISES.get(name, _always)(self):
                setattr(self, name, _forwarded(getattr(plugin, name), OPTIONAL[name]))

    def _has(self, name: str) -> bool:
        return name in self.defined


def _always(backend: Backend) -> bool:
    return True


def _forwarded(member: Any, kind: _Kind) -> Any:
    if not kind.yes_no:
        return member
    return lambda *args, **kwargs: bool(member(*args, **kwargs))
