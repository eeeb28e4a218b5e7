"""Test backend families that need hardware of their own, for the Ray executor tests.

Each runs the flat module in eager torch on the CPU (sleeping `sleep_s` before each call,
to keep a job in flight) and declares, through `requires`, a Ray custom resource that a
node must advertise to run it: `special_cpu_fp32` needs `special`, `doomed_cpu_fp32`
needs `doomed`, `nowhere_cpu_fp32` needs `nowhere` (which no node has), and
`sleepy_cpu_fp32` nothing beyond a CPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

import torch

from opdiff_snap.backends.base import Artifact, Availability, Preset


class _NeedsHardware:
    family = ""
    devices = ("cpu",)
    precisions = ("fp32",)
    default_options: Mapping[str, Any] = {"sleep_s": 0.0}
    serializes = False
    can_differentiate = False

    def requires(self, preset: Preset) -> frozenset[str]:
        return frozenset({self.family})

    def availability(self, preset: Preset) -> Availability:
        return Availability(True, True)

    def export(self, module: torch.nn.Module, inputs, preset: Preset, workdir: Path) -> Artifact:
        return Artifact(obj=module)

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0):
        pause = float(preset.options["sleep_s"])

        def run(inputs):
            time.sleep(pause)
            return artifact.obj(*inputs)

        return run


class SpecialBackend(_NeedsHardware):
    family = "special"


class DoomedBackend(_NeedsHardware):
    family = "doomed"


class NowhereBackend(_NeedsHardware):
    family = "nowhere"


class SleepyBackend(_NeedsHardware):
    family = "sleepy"

    def requires(self, preset: Preset) -> frozenset[str]:
        return frozenset()
