"""A backend family, `stages`, that fails the stage its device names, for the pytest
plugin's verdict tests. It runs the flat module in eager torch otherwise.

    stages_export_fp32   export raises                  -> EXPORT_FAIL
    stages_load_fp32     load raises                    -> LOAD_FAIL
    stages_infer_fp32    the runnable raises            -> INFER_FAIL
    stages_crash_fp32    the runnable segfaults         -> CRASH
    stages_hang_fp32     the runnable never returns     -> TIMEOUT
    stages_absent_fp32   cannot run on this machine     -> UNAVAILABLE
    stages_fine_fp32     runs like torch_cpu_fp32       -> PASS

Registered through the entry point group `opdiff_snap.backends` by the tests
(helpers.pytest.make_site writes a *.dist-info pointing here).
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Any, Mapping

import torch

from opdiff_snap.backends.base import Artifact, Availability, Preset


class StagesBackend:
    family = "stages"
    devices = ("export", "load", "infer", "crash", "hang", "absent", "fine")
    precisions = ("fp32",)
    default_options: Mapping[str, Any] = {}
    serializes = False
    can_differentiate = False

    def availability(self, preset: Preset) -> Availability:
        if preset.device == "absent":
            return Availability(False, False, "stages_absent needs hardware this machine does not have (test)")
        return Availability(True, True)

    def export(self, module: torch.nn.Module, inputs, preset: Preset, workdir: Path) -> Artifact:
        if preset.device == "export":
            raise RuntimeError("the exporter does not support this graph (test)")
        return Artifact(obj=module)

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0):
        if preset.device == "load":
            raise RuntimeError("the runtime rejected the artifact (test)")
        module = artifact.obj

        def run(inputs):
            if preset.device == "infer":
                raise RuntimeError("kernel missing at run time (test)")
            if preset.device == "crash":
                ctypes.string_at(0)
            if preset.device == "hang":
                while True:
                    time.sleep(1)
            with torch.no_grad():
                out = module(*inputs)
            return [out] if isinstance(out, torch.Tensor) else list(out)

        return run
