"""A worker's warm-up: before it says hello, it exports, loads and runs a tiny module
through the backend of each preset the run needs, so that the exporter's and the
runtime's first-use costs (imports, op registries, kernel tables; seconds for ONNX and
ExecuTorch) are paid while the parent plans, not by the run's first job. A preset whose
artifacts the cache holds already (its jobs will load, not export) only has its runtime
imported (Backend.prepare_runtime), so that `load_ms` times the load alone. Nothing it does
reaches a result: a warm-up that fails costs only its time, and the first job then meets
the same problem and reports it. Only the built-in families warm up: it runs before the
worker is ready, where a plug-in that crashes or hangs would be taken for a worker that
cannot start."""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ..backends.base import Preset


@dataclass(frozen=True)
class WarmUp:
    """What a worker warms up for one preset: its exporter and runtime (`export`), or its
    runtime only (its artifacts are cached)."""

    preset: Preset
    export: bool = True


def warm_ups(presets: Sequence[Preset], cache: Path | str | None) -> list[WarmUp]:
    """The warm-up of each preset: the runtime only where `cache` (None: no cache) holds
    artifacts exported for it."""
    from .cache import holds_artifacts_of

    return [WarmUp(p, not (cache is not None and holds_artifacts_of(cache, p.name))) for p in presets]


def warm_up(warm: Sequence[WarmUp], threads: int = 0) -> dict[str, float]:
    """Seconds each preset's warm-up took, by preset name (failures included)."""
    import torch

    from ..backends.registry import backend_for, is_builtin
    from .export_load import export_and_load
    from .prepare import prepare_call

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (torch.relu(self.linear(x)),)

    with torch.random.fork_rng(devices=[]):   # the jobs' random streams stay as they were
        module = Tiny().eval()
    # a flat module, as jobs hand backends (execution/prepare.py)
    prepared = prepare_call({"a": module}, [torch.linspace(-1.0, 1.0, 8).reshape(2, 4)], {}, "the warm-up module")
    spent: dict[str, float] = {}
    for item in warm:
        preset = item.preset
        t0 = time.perf_counter()
        try:
            backend = backend_for(preset)
            if not is_builtin(backend):
                continue
            avail = backend.availability(preset)
            if avail.can_run:
                backend.prepare_runtime(preset)
            if avail.can_export and item.export:
                with tempfile.TemporaryDirectory(prefix="opdiff-warmup-") as tmp, torch.no_grad():
                    step = export_and_load(backend, preset, prepared, Path(tmp), load=avail.can_run,
                                           threads=threads)
                    if step.runnable is not None:
                        step.runnable(prepared.fresh_inputs())
                    del step   # the runtime lets go of the artifact before its folder is removed
        except Exception:
            pass   # the first job that needs this backend says what is wrong
        spent[preset.name] = time.perf_counter() - t0
    return spent
