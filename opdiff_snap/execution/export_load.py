"""The one way a flat module becomes something to run: exported through a backend, then
loaded. Each step is timed, and a failure is kept with the step it happened in
(EXPORT_FAIL, LOAD_FAIL) and its exception, never raised. The runner builds its artifact
cache and its verdicts on top (runner.py), the op-support answers use it alone
(op_support.py), and a worker's warm-up runs it on a tiny module (warmup.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..backends.base import Artifact, Backend, Delegation, Dynamic, Preset, Quantized, QuantizeFailed, Runnable
from ..core.errors import error_text, headline
from ..core.verdicts import Verdict

if TYPE_CHECKING:
    import torch

    from .prepare import Prepared

Export = Callable[[Path], Artifact]
"""The export step itself: write the artifact into the folder given, return it."""

Store = Callable[[Export], "tuple[Artifact, float]"]
"""Where an export goes instead of a plain folder (the runner's artifact cache): handed the
export step, it runs it in a folder of its own, or finds its artifact made already, and
returns the artifact to load and the export's milliseconds."""


class DynamicRefused(Exception):
    """A sized test (dynamic shapes) on a preset that exports static shapes only."""


@dataclass
class Lowered:
    """What exporting and loading gave: the artifact and, where it was loaded, the
    runnable; or the step that failed (`status`) and its exception."""

    status: Verdict | None = None          # None, QUANTIZE_FAIL, EXPORT_FAIL or LOAD_FAIL
    error: Exception | None = None
    artifact: Artifact | None = None
    runnable: Runnable | None = None       # None: failed, or not loaded (`load` False)
    export_ms: float = 0.0
    load_ms: float | None = None
    delegation: Delegation | None = None   # Backend.delegation, once the export is made
    delegation_error: str | None = None    # why the backend could not say it (unreadable evidence)
    quantized: Quantized | None = None     # an int8 preset's quantized reference, kept with the artifact
    rerun_failed: bool = False             # QUANTIZE_FAIL of this size's quantized reference, not of the export


def export_and_load(backend: Backend, preset: Preset, prepared: Prepared, workdir: Path | None = None, *,
                    store: Store | None = None, load: bool = True, threads: int = 0,
                    calibration: Callable[[], Sequence[tuple[torch.Tensor, ...]]] | None = None) -> Lowered:
    """Export `prepared` (a flat module and its example inputs) through `backend` into
    `workdir` (created if need be), or through `store`; then, with `load` (this machine
    can run the preset), load it with `threads` intra-op threads. A quantizing preset is
    quantized first (Backend.export_quantized) from the samples `calibration` draws, only
    when the export runs (None: from the example inputs themselves, as an op survey or a
    warm-up does), and its quantized reference is written beside the artifact and read
    back with it. A sized test's export (dynamic dims) is made at the example sizes, so
    that every size shares it; on an int8 preset, its quantized reference is the quantized
    model kept with the artifact rerun on this test's own inputs (Backend.quantized_reference)."""
    import torch

    from . import int8_reference as q

    quantizing = backend.quantizes(preset)
    made: list[Quantized] = []    # what this export quantized (none: the artifact came from the store)

    def export(work: Path) -> Artifact:
        inputs = tuple(prepared.fresh_inputs())
        dims = prepared.dynamic or ()
        if prepared.dynamic is not None:
            refusal = backend.dynamic_refusal(preset)
            if refusal:
                raise DynamicRefused(f"{preset.name} does not export dynamic shapes: {refusal}; this test is "
                                     "checked on its static shapes by the test it sizes")
            inputs = _at_example_sizes(inputs, prepared.dynamic)
            if not quantizing:
                with torch.no_grad():
                    return backend.export_dynamic(prepared.module, inputs, prepared.dynamic, preset, work)
        with torch.no_grad():
            if not quantizing:
                return backend.export(prepared.module, inputs, preset, work)
            samples = _samples(calibration) if calibration is not None else [tuple(t.clone() for t in inputs)]
            extra = (dims,) if dims else ()   # a backend that keeps no quantized model takes no dims
            artifact, quantized = backend.export_quantized(prepared.module, inputs, samples, preset, work, *extra)
        quantized.calibration = q.digest(samples)
        if artifact.path is not None:   # kept beside a serialised artifact, and so in the cache with it
            q.save(Path(artifact.path), quantized)
        made.append(quantized)
        return artifact

    out = Lowered()
    try:
        t0 = time.perf_counter()
        if store is not None:
            out.artifact, out.export_ms = store(export)
        else:
            assert workdir is not None, "export_and_load needs a workdir or a store"
            workdir.mkdir(parents=True, exist_ok=True)
            out.artifact = export(workdir)
            out.export_ms = (time.perf_counter() - t0) * 1e3
    except QuantizeFailed as exc:
        out.status, out.error = Verdict.QUANTIZE_FAIL, exc
        return out
    except Exception as exc:
        out.status, out.error = Verdict.EXPORT_FAIL, exc
        return out
    if quantizing:
        try:
            out.quantized = q.load(Path(out.artifact.path)) if out.artifact.path is not None else made[0]
        except (ValueError, IndexError) as exc:
            out.status, out.error = Verdict.LOAD_FAIL, exc
            return out
        if prepared.dynamic is not None and not _sized_reference(backend, preset, prepared, out):
            return out
    try:
        out.delegation = backend.delegation(out.artifact, preset)
    except Exception as exc:
        out.delegation_error = headline(error_text(exc), 300)
    if load:
        try:
            t0 = time.perf_counter()
            out.runnable = backend.load(out.artifact, preset, threads=threads)
            out.load_ms = (time.perf_counter() - t0) * 1e3
        except Exception as exc:
            out.status, out.error = Verdict.LOAD_FAIL, exc
    return out


def _sized_reference(backend: Backend, preset: Preset, prepared: Prepared, out: Lowered) -> bool:
    """A sized test's quantized reference: the artifact's is at the dims' example sizes, so
    the quantized model kept with it is run on this size's own inputs. False (and `out`
    says QUANTIZE_FAIL) where that fails."""
    import torch

    assert out.artifact is not None and out.quantized is not None
    try:
        with torch.no_grad():
            out.quantized.reference = backend.quantized_reference(out.artifact, tuple(prepared.fresh_inputs()), preset)
    except Exception as exc:
        out.status, out.rerun_failed = Verdict.QUANTIZE_FAIL, True
        out.error = QuantizeFailed(f"the quantized model kept with the artifact failed at this size: "
                                   f"{type(exc).__name__}: {exc}")
        return False
    return True


def _at_example_sizes(inputs: tuple[torch.Tensor, ...], dims: Dynamic) -> tuple[torch.Tensor, ...]:
    """The inputs cut (or repeated) along each dynamic axis to its dim's example size: the
    sized tests of one test export the same program whichever of them exports it."""
    import torch

    out = []
    for t, axes in zip(inputs, dims):
        for axis, d in axes.items():
            n, have = d.example, t.shape[axis]
            if n != have:
                t = torch.cat([t] * -(-n // have), dim=axis).narrow(axis, 0, n)
        out.append(t.contiguous())
    return tuple(out)


def _samples(calibration: Callable[[], Sequence[tuple[torch.Tensor, ...]]]) -> list[tuple[torch.Tensor, ...]]:
    """The calibration samples drawn; drawing them failing is the quantizer's stage."""
    try:
        return list(calibration())
    except Exception as exc:
        raise QuantizeFailed(f"drawing the calibration inputs failed: {type(exc).__name__}: {exc}") from exc
