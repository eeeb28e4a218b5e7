"""A unit of work for a backend, and what came of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..backends.base import Preset
from ..suite.model import Invocation, TestCase
from ..verdicts import Verdict


@dataclass
class Job:
    """Run one (test, seed) on one preset. Picklable: it travels to worker processes."""

    case: TestCase
    seed: int
    invocation: Invocation
    preset: Preset
    repeats: int = 1
    warmup: int = 1
    cache_dir: Path | None = None   # artifact cache root; None disables the cache
    key: str = ""                   # caller's handle, echoed back in the Outcome
    reference: bool = False         # also run the module eagerly in float64 (record)


@dataclass
class Outcome:
    """What the backend did. `status` is None when it ran and produced `outputs`
    (to be compared); otherwise a failure verdict (EXPORT_FAIL, LOAD_FAIL, INFER_FAIL,
    CRASH, TIMEOUT, UNAVAILABLE) with the error."""

    key: str
    status: Verdict | None
    outputs: list[torch.Tensor] | None = None     # flat, on CPU, floating ones in the golden's dtypes
    output_structure: Any = None                  # trees.flatten structure of the outputs
    export_ms: float | None = None
    load_ms: float | None = None
    infer_ms: float | None = None                 # median of infer_ms_all
    infer_ms_all: list[float] = field(default_factory=list)
    error_class: str | None = None
    error_message: str | None = None
    cache_hit: bool = False
    worker_pid: int | None = None
    # with Job.reference: the float64 outputs, flat like `outputs` (None for an output
    # that is not floating or already float64), or why there are none
    reference: list[torch.Tensor | None] | None = None
    reference_note: str | None = None
