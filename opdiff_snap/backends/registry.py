"""The preset registry: built-in families, third-party backends, options and overrides.

A preset is `<family>_<device>_<precision>` with fully resolved options:
`default_options` of the family, then the family's `preset_options(device, precision)`
(values that follow from the name, e.g. the ONNX execution provider),
then the user's overrides. Overrides come as a dict, a JSON string or a JSON file, in
any of these shapes (opdiff's keep working):

    {"opset": 18}                                  flat options
    {"onnx_overrides": {"opset": 18}}              opdiff's per-section form
    {"onnx_cpu_fp32": {"onnx_overrides": {...}}}   opdiff's per-preset file

Third-party backends register under the entry point group `opdiff_snap.backends`; each
is checked against the surface declared in base.py when it loads.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib
import importlib.metadata
import inspect
import json
import math
from pathlib import Path
from typing import Any, Mapping

from ..core.environment import PLUGIN_GROUP
from ..core.errors import OpdiffError, suggest
from ..core.jsonvalues import loads as json_loads
from ..core.jsonvalues import nested_too_deep, too_deep
from ..core.limits import MAX_OPTIONS_BYTES, MAX_OPTIONS_FILE_BYTES, OPTION_INT, Range
from ..core.regular_files import read_text_bounded
from .base import Availability, Backend, Preset
from .coreml import CoreMLBackend
from .executorch import ExecuTorchBackend
from .inductor import InductorBackend
from .int8_quantizers import INT8_KINDS
from .onnx import OnnxBackend
from .surface import PluginBackend, surface_problem
from .torch_eager import TorchEagerBackend

ENTRY_POINT_GROUP = PLUGIN_GROUP   # core.environment reports the versions of its distributions

_BUILTIN: tuple[Backend, ...] = (TorchEagerBackend(), InductorBackend(), OnnxBackend(),
                                 ExecuTorchBackend(), CoreMLBackend())


# ---------------------------------------------------------------- families and plugins

@functools.lru_cache(maxsize=1)
def _plugins() -> tuple[dict[str, Backend], dict[str, str]]:
    """Backends from entry points, and an error message per entry point that failed."""
    backends: dict[str, Backend] = {}
    errors: dict[str, str] = {}
    builtin = {b.family for b in _BUILTIN}
    try:
        entry_points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception as exc:  # malformed metadata somewhere on sys.path
        return backends, {"*": f"reading entry points of group {ENTRY_POINT_GROUP} failed: {exc}"}
    for ep in entry_points:
        label = f"backend plugin '{ep.name}' ({ep.value}, entry point group {ENTRY_POINT_GROUP})"
        try:
            obj = ep.load()
            if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Backend) and surface_problem(obj)):
                obj = obj()   # a class, or a factory: what it makes is the backend
        except Exception as exc:  # a broken plugin must not break every command
            errors[ep.name] = f"{label} failed to load: {type(exc).__name__}: {exc}"
            continue
        problem = _plugin_problem(obj, builtin | set(backends))
        if problem:
            errors[ep.name] = f"{label} is not usable: {problem}"
            continue
        backends[obj.family] = obj if isinstance(obj, Backend) else PluginBackend(obj)
    return backends, errors


def _plugin_problem(obj: Any, taken: set[str]) -> str:
    """Why a plugin's object cannot serve as a backend ("": it can): what it lacks of the
    surface declared in base.py or has of the wrong kind, then what its values break."""
    problem = surface_problem(obj)
    if problem:
        return problem
    if not isinstance(obj.family, str) or not obj.family:
        return "its 'family' must be a non-empty string"
    if obj.family in taken:
        return f"family '{obj.family}' is already provided by another backend"
    if not obj.devices or not obj.precisions:
        return "it declares no devices or no precisions"
    try:
        inspect.signature(obj.load).bind(None, None, threads=0)
    except TypeError:
        return ("its load() does not take the `threads` argument of the Backend protocol "
                "(load(artifact, preset, threads=0))")
    except ValueError:
        pass  # no signature to inspect (a builtin): trust it
    try:
        json.dumps(dict(obj.default_options))
    except (TypeError, ValueError) as exc:
        return f"its default_options are not JSON-serialisable ({exc})"
    return ""


def reload_plugins() -> None:
    """Forget loaded entry points (after installing a plugin into a running process)."""
    importlib.invalidate_caches()
    _plugins.cache_clear()
    _table.cache_clear()


def plugin_errors() -> list[str]:
    """One message per third-party backend entry point that could not be used."""
    return list(_plugins()[1].values())


def is_builtin(backend: Backend) -> bool:
    """Whether `backend` is one of ours (a plug-in's may crash or hang where ours do not)."""
    return any(backend is b for b in _BUILTIN)


def families() -> dict[str, Backend]:
    out = {b.family: b for b in _BUILTIN}
    out.update(_plugins()[0])
    return out


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, tuple[Backend, str, str]]:
    table: dict[str, tuple[Backend, str, str]] = {}
    for backend in families().values():
        for device in backend.devices:
            for precision in backend.precisions:
                if not _offers(backend, device, precision):
                    continue
                table.setdefault(f"{backend.family}_{device}_{precision}", (backend, device, precision))
    return table


def _offers(backend: Backend, device: str, precision: str) -> bool:
    try:
        return bool(backend.offers(device, precision))
    except Exception:   # a broken plugin: its presets stay named, and fail where they run
        return True


def preset_names() -> list[str]:
    return list(_table())


# ---------------------------------------------------------------- presets

def all_presets() -> list[Preset]:
    """Every preset with its default options (built-in families first)."""
    return [_make(name, {}) for name in _table()]


def get_preset(name: str, overrides: Mapping[str, Any] | str | Path | None = None) -> Preset:
    """The preset `name` with defaults merged with `overrides` (dict, JSON string or JSON file)."""
    return _make(name, load_overrides(overrides, name))


def backend_for(preset: Preset) -> Backend:
    backend = families().get(preset.family)
    if backend is None:
        raise OpdiffError(f"preset '{preset.name}': no backend family '{preset.family}' is installed"
                          f"{suggest(preset.family, families())}.{_plugin_note()}")
    return backend


def availability(preset: Preset) -> Availability:
    """Whether this machine can export / run `preset`, and why not. Never raises."""
    try:
        return backend_for(preset).availability(preset)
    except Exception as exc:
        return Availability(False, False, f"availability check of '{preset.name}' failed: "
                                          f"{type(exc).__name__}: {exc}")


def requirements(preset: Preset) -> frozenset[str]:
    """What `preset` needs from a machine beyond a CPU (Backend.requires: nothing unless
    the backend says). The Ray executor routes jobs on it."""
    backend = backend_for(preset)
    try:
        needs = backend.requires(preset)
        if isinstance(needs, str) or not all(isinstance(n, str) and n for n in needs):
            raise TypeError(f"it returned {needs!r}, not a set of names")
        return frozenset(needs)
    except Exception as exc:
        raise OpdiffError(f"preset '{preset.name}': the {backend.family} backend's requires() failed "
                          f"({type(exc).__name__}: {exc}); it must return a set of names such as "
                          "{'cuda'}. Fix the backend plugin.") from None


def _make(name: str, flat_overrides: Mapping[str, Any]) -> Preset:
    entry = _table().get(name) if isinstance(name, str) else None
    if entry is None:
        raise OpdiffError(_unknown_preset_message(name))
    backend, device, precision = entry
    options = copy.deepcopy(dict(backend.default_options))
    options.update(copy.deepcopy(backend.preset_options(device, precision)))
    options.update(_check_overrides(name, backend, options, flat_overrides))
    try:
        size = len(json.dumps(options).encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise OpdiffError(f"preset '{name}': options must be JSON values ({exc}).") from None
    if size > MAX_OPTIONS_BYTES:
        raise OpdiffError(f"preset '{name}': its options take {size:,} bytes as JSON, more than the "
                          f"{MAX_OPTIONS_BYTES:,} allowed (every run records them); give smaller option values.")
    return Preset(name=name, family=backend.family, device=device, precision=precision, options=options)


def _unknown_preset_message(name: Any) -> str:
    names = list(_table())
    if isinstance(name, str):
        for ep_name, message in _plugins()[1].items():
            if name.startswith(ep_name + "_"):
                return f"preset '{name}' belongs to a backend plugin that cannot be used: {message}"
    close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return (f"unknown backend preset '{name}'.{hint} Presets are named <family>_<device>_<precision>; "
            f"families: {', '.join(families())}. `opdiff list-presets` lists them all.{_plugin_note()}")


def _plugin_note() -> str:
    errs = plugin_errors()
    return (" Note: " + " ".join(errs)) if errs else ""


# ---------------------------------------------------------------- overrides

def load_overrides(source: Mapping[str, Any] | str | Path | None, preset_name: str = "") -> dict[str, Any]:
    """Flat option overrides for `preset_name` from a dict, a JSON string or a JSON file path."""
    if source is None:
        return {}
    where = "overrides"
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        path = Path(source)
        where = f"overrides file {path}"
        if not path.exists():
            raise OpdiffError(f"backend overrides '{source}' is neither a JSON object nor an existing "
                              "JSON file; pass e.g. '{\"opset\": 18}' or a path to a .json file.")
        text = read_text_bounded(path, MAX_OPTIONS_FILE_BYTES, "options file", where)
    elif isinstance(source, str):
        text = source
    else:
        text = None
    if text is not None:
        source = json_loads(text, where, "write an object such as {\"opset\": 18}")
    elif too_deep(source):
        raise nested_too_deep(where)
    if not isinstance(source, Mapping):
        raise OpdiffError(f"{where}: expected a JSON object of option names to values, "
                          f"got {type(source).__name__}.")
    names = set(_table())
    if any(k in names for k in source):
        bad = [k for k in source if k not in names]
        if bad:
            raise OpdiffError(f"{where}: '{bad[0]}' is not a preset name{suggest(bad[0], names)}; a "
                              "per-preset overrides object maps preset names to option objects.")
        source = source.get(preset_name) or {}
        if not isinstance(source, Mapping):
            raise OpdiffError(f"{where}: the entry for '{preset_name}' must be an object of options.")
    flat: dict[str, Any] = {}
    for key, value in source.items():
        if isinstance(key, str) and key.endswith("_overrides") and isinstance(value, Mapping):
            flat.update(value)  # opdiff's {"onnx_overrides": {...}} sections
        else:
            flat[key] = value
    return flat


def _check_overrides(name: str, backend: Backend, defaults: Mapping[str, Any],
                     overrides: Mapping[str, Any]) -> dict[str, Any]:
    aliases, ranges = backend.option_aliases, backend.option_ranges
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        key = aliases.get(key, key)
        if key not in defaults:
            known = ", ".join(sorted(defaults)) or "(none)"
            raise OpdiffError(f"preset '{name}': unknown option '{key}' for the {backend.family} family"
                              f"{suggest(key, defaults)}. Known options: {known}.")
        default = defaults[key]
        if value is not None and default is not None and not _same_kind(default, value):
            raise OpdiffError(f"preset '{name}': option '{key}' expects {type(default).__name__} "
                              f"(default {json.dumps(default)}), got {json.dumps(value, default=repr)}.")
        bounds = ranges.get(key) or (OPTION_INT if _is_count(default) else None)
        why = _kind_problem(backend, key, default, value) or _number_problem(value, bounds)
        if why:
            raise OpdiffError(f"preset '{name}': option '{key}': {why} (default {json.dumps(default)}).")
        out[key] = copy.deepcopy(value)
    return out


def _kind_problem(backend: Backend, key: str, default: Any, value: Any) -> str | None:
    """Why `value` is not of the kind a built-in int8 option with a null default takes."""
    if default is not None or value is None or key not in INT8_KINDS or not is_builtin(backend):
        return None
    kind, words = INT8_KINDS[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (kind is bool and isinstance(value, bool)) or (kind is float and number):
        return None
    shown = json.dumps(value, default=repr)
    return f"{shown[:80]} is not {words}; give {words}, or null for the precision's own"


def _is_count(default: Any) -> bool:
    return isinstance(default, int) and not isinstance(default, bool)


def _number_problem(value: Any, bounds: Range | None) -> str | None:
    """Why a preset option's value is refused as a number: outside the option's range (a
    backend's `option_ranges`, or a whole number a C API takes where the default is one),
    or anywhere inside it a number that is not finite (JSON's NaN, Infinity, 1e400)."""
    if value is None:
        return None
    if bounds is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        why = bounds.problem(value)
        return f"{json.dumps(value)} is {why}" if why else None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{json.dumps(value)} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return f"{value} is out of range for a 64-bit integer"
    if isinstance(value, Mapping):
        return next((f"in '{k}': {w}" for k, v in value.items() if (w := _number_problem(v, None))), None)
    if isinstance(value, (list, tuple)):
        return next((f"item {i}: {w}" for i, v in enumerate(value) if (w := _number_problem(v, None))), None)
    return None


def _same_kind(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    return isinstance(value, type(default))
