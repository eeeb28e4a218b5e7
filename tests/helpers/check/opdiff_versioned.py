"""A backend plugin, `versioned_cpu_fp32`, whose release 1.1 made one op slower: eager torch,
except that from version 1.1 of its distribution (`opdiff-versioned-test`, read from its
metadata the way any package knows its version) a module that runs aten::exp sleeps
2 ms first; and so at any version while OPDIFF_VERSIONED_SLOW_EXP=1 is set when it loads
(the same slowdown with nothing in the recorded environment changing). For the tests that
a plugin's upgrade is an environment change `opdiff regressions` attributes, and that a
step with no environment change is reported all the same."""

from __future__ import annotations

import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opdiff_snap.backends.base import Artifact, Availability, Preset

DISTRIBUTION = "opdiff-versioned-test"
SLOW_VARIABLE = "OPDIFF_VERSIONED_SLOW_EXP"


class _SeesExp(TorchDispatchMode):
    """Notes whether aten::exp runs (once per loaded module, so the other calls run bare)."""

    seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen = self.seen or func._schema.name == "aten::exp"
        return func(*args, **(kwargs or {}))


class VersionedBackend:
    family = "versioned"
    devices = ("cpu",)
    precisions = ("fp32",)
    default_options: Mapping[str, Any] = {}
    serializes = False
    can_differentiate = False

    def availability(self, preset: Preset) -> Availability:
        return Availability(True, True)

    def export(self, module: torch.nn.Module, inputs, preset: Preset, workdir: Path) -> Artifact:
        return Artifact(obj=module)

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0):
        module = artifact.obj
        slow = metadata.version(DISTRIBUTION) != "1.0" or os.environ.get(SLOW_VARIABLE) == "1"
        uses_exp: list[bool] = []

        def run(inputs):
            with torch.no_grad():
                if not uses_exp:
                    with _SeesExp() as seen:
                        out = module(*inputs)
                    uses_exp.append(seen.seen)
                    return out
                if slow and uses_exp[0]:
                    time.sleep(0.002)
                return module(*inputs)

        return run
