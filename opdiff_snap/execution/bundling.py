"""A job's side of a replay bundle (core/bundle_format.py): writing the artifact check would
run and the inputs its runtime is fed into the bundle (`opdiff bundle`), and taking the
outputs a device returned in place of running the artifact here (`check --outputs-from`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..backends.base import Artifact, Backend, Preset
from ..backends.executorch_lowering import DELEGATION_FILE
from ..core.bundle_format import ArraySpec, digest_path
from .int8_reference import REFERENCE_FILE, STEPS_FILE

if TYPE_CHECKING:
    import torch

    from .prepare import Prepared

# what opdiff keeps beside an artifact for itself: the quantized reference, the delegation
_OURS = (REFERENCE_FILE, STEPS_FILE, DELEGATION_FILE)


@dataclass(frozen=True)
class Returned:
    """What a device returned for one job: its outputs, flat, and its timings."""

    outputs: list[torch.Tensor]
    infer_ms_all: tuple[float, ...] = ()
    load_ms: float | None = None
    calibration: str = ""   # an int8 entry's: the quantized reference judged against must share it


@dataclass(frozen=True)
class Bundled:
    """Where one job's artifact and inputs went in the bundle, with their digests."""

    artifact: str
    artifact_sha256: str
    inputs: str
    inputs_sha256: str
    input_specs: tuple[ArraySpec, ...]
    bundled_program: str = ""


def write_piece(into: Path, entry_id: str, backend: Backend, preset: Preset, artifact: Artifact,
                prepared: Prepared, expected: list[torch.Tensor] | None) -> Bundled:
    """Copy the artifact into `into`/artifacts (once per distinct artifact) and write the
    fed inputs to `into`/inputs/<entry_id>.npz; on ExecuTorch, the BundledProgram too,
    with `expected` (the golden's outputs) as what it must give."""
    assert artifact.path is not None, "only serialised artifacts are bundled"
    folder = _copy_artifact(into, Path(artifact.path))
    feed = backend.device_feed(preset, prepared.fresh_inputs())
    arrays = {f"in{i}": _array(t) for i, t in enumerate(feed)}
    inputs = into / "inputs" / f"{entry_id}.npz"
    inputs.parent.mkdir(parents=True, exist_ok=True)
    with open(inputs, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]   # numpy's stub types the first keyword
    bundled_program = ""
    if backend.family == "executorch" and expected is not None:
        from .bundled_program import write_bundled_program

        pte = next(iter(sorted(folder.glob("*.pte"))))
        target = into / "bundled" / f"{entry_id}.bpte"
        write_bundled_program(pte, feed, expected, target)
        bundled_program = target.relative_to(into).as_posix()
    return Bundled(folder.relative_to(into).as_posix(), digest_path(folder), inputs.relative_to(into).as_posix(),
                   digest_path(inputs), tuple(ArraySpec.of(a) for a in arrays.values()), bundled_program)


def _array(t: torch.Tensor) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        raise TypeError("a bfloat16 input cannot be stored for a device: NumPy has no bfloat16")
    return t.detach().cpu().contiguous().numpy()


def _copy_artifact(into: Path, source: Path) -> Path:
    """`into`/artifacts/<digest prefix>: the artifact's files without opdiff's own, the same
    folder for every job whose artifact is the same (a sized test's sizes share one)."""
    root = into / "artifacts"
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    if source.is_dir():
        shutil.copytree(source, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*_OURS))
    else:
        shutil.copy2(source, staging / source.name)
    final = root / digest_path(staging)[:16]
    try:
        os.rename(staging, final)
    except OSError:   # made already, by this job's sibling
        shutil.rmtree(staging, ignore_errors=True)
    return final


@dataclass(frozen=True)
class BundleTarget:
    """Where a bundling job writes: the bundle's folder, its entry id, and the golden's
    outputs (flat) for a BundledProgram."""

    into: str
    entry: str
    expected: list[torch.Tensor] | None = None
