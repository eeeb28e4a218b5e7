"""Backends: the preset registry and one module per family (see docs/backends.md).

Import from the modules (`base`, `registry`): this package's own import loads no family,
so code that only names presets or reads results never imports torch or a runtime."""
