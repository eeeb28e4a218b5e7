"""Modules built from a config mapping: a `module` node with `config: {n_layer: 2, ...}` is
`cls(cls.config_class(**config), *args, **kwargs)`, the way a transformers model is made
from its configuration with random weights (nothing is downloaded).

transformers keeps a key its config class does not know as an attribute that no layer
reads, so a misspelt setting would build another model than the suite describes without
a word. A key is known when the config class has it (a field, an `attribute_map` alias,
a property, an `__init__` parameter) or the source of the model's module or of the
config class and its bases reads it (`config.key`, or `"key"` popped from the keyword
arguments: T5 reads `decoder_start_token_id`, which T5Config does not declare); anything
else is refused. Runs in workers only: it imports the class (see construct.py).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Any, Mapping, Sequence

from ..core.errors import OpdiffError, error_text, suggest


def _config_class(cls: Any, path: str) -> type:
    config_class = getattr(cls, "config_class", None)
    if not isinstance(config_class, type):
        raise OpdiffError(f"'{path}' has no config_class, so a `config` mapping cannot build it: `config` is "
                          "for classes built from a configuration object, such as transformers models "
                          "(transformers.GPT2LMHeadModel). Pass this class's arguments as args and kwargs "
                          "instead.")
    return config_class


def _known(config_class: type, defaults: Any) -> set[str]:
    """Every key the class takes: `__init__` parameters, the default instance's attributes,
    the class's properties and plain values, `attribute_map` aliases. Read statically, so
    no deprecated property is called."""
    try:
        params = {p.name for p in inspect.signature(config_class).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    except (TypeError, ValueError):
        params = set()
    statics = {name for name in dir(config_class) if not name.startswith("__")
               and (isinstance(attr := inspect.getattr_static(config_class, name), property) or not callable(attr))}
    return params | set(vars(defaults)) | statics | set(getattr(config_class, "attribute_map", {}) or {})


def _read_by_code(classes: Sequence[type], key: str) -> bool:
    """Whether the source of a module defining one of `classes` mentions `.key` or a 'key'
    string (a setting read or popped from the keyword arguments)."""
    pattern = re.compile(rf"\.{key}\b|[\"']{key}[\"']")
    return any(pattern.search(_source(module)) for module in dict.fromkeys(c.__module__ for c in classes))


@functools.lru_cache(maxsize=32)
def _source(module: str) -> str:
    try:
        return inspect.getsource(sys.modules[module])
    except (KeyError, TypeError, OSError):
        return ""


def config_problem(cls: Any, path: str, config: Mapping[str, Any]) -> str | None:
    """Why `config` cannot build `cls` (no config_class, an unknown key, a value the config
    class refuses), or None."""
    try:
        build_config(cls, path, config)
    except OpdiffError as exc:
        return str(exc)
    return None


def build_config(cls: Any, path: str, config: Mapping[str, Any]) -> Any:
    """`cls.config_class(**config)`, every key known to it or to `cls`'s module."""
    config_class = _config_class(cls, path)
    name = config_class.__name__
    try:
        defaults = config_class()
    except Exception:
        defaults = None   # no defaults to read the settings from: the keys go unchecked
    if defaults is not None:
        known = _known(config_class, defaults)
        code = [c for c in (cls, *config_class.__mro__) if c is not object]
        unknown = [k for k in config if k not in known and not _read_by_code(code, k)]
        if unknown:
            key = unknown[0]
            shown = sorted(k for k in known if not k.startswith("_"))
            raise OpdiffError(f"config key '{key}' is not a setting of {name}{suggest(key, shown)}, and neither "
                              f"{cls.__module__} nor the config's code reads it: transformers would keep it as an "
                              "attribute no layer reads, so the model would not be the one the suite describes. "
                              f"Fix or remove config.{key}"
                              + (f" (and {', '.join(unknown[1:])})" if unknown[1:] else "") + ".")
        bad = next(filter(None, (_value_problem(k, v, getattr(defaults, k, None)) for k, v in config.items())), None)
        if bad:
            raise OpdiffError(f"{name} cannot take {bad}. Fix that value in the test's config.")
    try:
        return config_class(**config)
    except Exception as exc:
        why = " ".join(error_text(exc).split())
        raise OpdiffError(f"{name} refused the config: {why}. Fix that value in the test's config.") from exc


# a count or size a test's model may hold in one setting: far beyond any real architecture's
# (vocabularies of 10^5-10^6, layers of 10^2), far short of what would fill a worker's memory
MAX_COUNT = 10_000_000


def _value_problem(key: str, value: Any, default: Any) -> str | None:
    """What is wrong with `value` for a setting whose default is `default`, where that is
    knowable before the model is built: an integer setting (a size, a count) given a float,
    a bool or text, a negative one whose default is not, or one past MAX_COUNT."""
    if not isinstance(default, int) or isinstance(default, bool) or value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{key}: {value!r}: it is an integer setting (default {default}), and this is a {type(value).__name__}"
    if value < 0 <= default:
        return f"{key}: {value}: a size or count is not negative"
    if value > MAX_COUNT and default <= MAX_COUNT:
        return (f"{key}: {value}: more than {MAX_COUNT:,} in one setting would not fit in a worker's memory "
                "(a test's model is built whole, with random weights)")
    return None


def build_from_config(cls: Any, path: str, config: Mapping[str, Any], args: Sequence[Any],
                      kwargs: Mapping[str, Any]) -> Any:
    """`cls(config_class(**config), *args, **kwargs)`."""
    return cls(build_config(cls, path, config), *args, **kwargs)
