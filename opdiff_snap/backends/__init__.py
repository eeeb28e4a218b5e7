"""Backends: the preset registry and one module per family (see docs/backends.md)."""

from .base import Artifact, Availability, Backend, Preset, Runnable
from .registry import (
           ENTRY_POINT_GROUP,
           all_presets,
           availability,
           backend_for,
           families,
           get_preset,
           load_overrides,
           plugin_errors,
           preset_names,
           reload_plugins,
)

__all__ = ["Artifact", "Availability", "Backend", "Preset", "Runnable", "ENTRY_POINT_GROUP",
           "all_presets", "availability", "backend_for", "families", "get_preset",
           "load_overrides", "plugin_errors", "preset_names", "reload_plugins"]
