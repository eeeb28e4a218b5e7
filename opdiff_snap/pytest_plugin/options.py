"""What the command line and the ini file ask of the plugin, and where a config keeps the
plugin's state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class Options:
    """What the command line and the ini file ask of the plugin (no heavy imports)."""

    enabled: bool = False                  # --opdiff / ini opdiff: collect suites and goldens
    backends: list[str] = field(default_factory=list)
    preset_options: dict[str, str] = field(default_factory=dict)
    update: bool = False                   # --opdiff-update: re-record and prune fixture goldens
    jobs: int | None = None
    batch: int | None = None
    baseline: str = "torch_cpu_fp32"

    @classmethod
    def of(cls, config: pytest.Config) -> "Options":
        backends = list(config.getoption("opdiff_backends") or []) or list(config.getini("opdiff_backends"))
        options: dict[str, str] = {}
        for value in config.getoption("opdiff_preset_options") or []:
            name, sep, body = value.partition("=")
            if not sep or not name or not body:
                pytest.exit(f"opdiff: error: --opdiff-preset-options '{value}': write PRESET=JSON or "
                            "PRESET=path/to/options.json, e.g. onnx_cpu_fp32='{\"opset\": 18}'.", returncode=2)
            options[name] = body
        return cls(enabled=bool(config.getoption("opdiff") or config.getini("opdiff")),
                   backends=list(dict.fromkeys(backends)), preset_options=options,
                   update=bool(config.getoption("opdiff_update")), jobs=config.getoption("opdiff_jobs"),
                   batch=config.getoption("opdiff_batch"),
                   baseline=str(config.getini("opdiff_baseline") or "torch_cpu_fp32"))


PLUGIN_KEY = pytest.StashKey[Any]()   # the config's Plugin (pytest_plugin/__init__.py)


def plugin_of(config: pytest.Config) -> Any:
    return config.stash[PLUGIN_KEY]
