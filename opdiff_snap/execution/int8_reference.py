"""What checking an int8 preset needs beside its artifact: the calibration inputs it is
quantized from, and the quantized reference kept with the artifact.

Calibration is data. Each sample is drawn from the test's own input spec, on a seed
stream of its own (suite.materialize.calibration_seed) apart from the golden's inputs, so
any machine with the test's definition draws the same bytes; the digest of those bytes
travels with every result, where two runs can be seen to have quantized alike. The
module's weights are the golden's.

The quantized reference (the model after quantization, before lowering, on the golden's
inputs) and each output's quantization step are written into the artifact's folder
beside it, so the artifact cache keeps them with it and a cached artifact is judged
against the same reference it was made with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Sequence

import torch

from ..backends.base import Quantized
from ..suite import dynamic
from ..suite.construct import call_inputs
from ..suite.materialize import calibration_seed, sample_inputs
from ..suite.model import Invocation, TestCase
from .prepare import tensor_inputs

REFERENCE_FILE = "quantized_reference.pt"
STEPS_FILE = "quantized.json"


def calibration_inputs(case: TestCase, invocation: Invocation, seed: int, count: int
                       ) -> list[tuple[torch.Tensor, ...]]:
    """`count` calibration samples of (case, seed), each as the flat module takes its
    inputs; the module states are the golden's. The sized tests of one test (dynamic
    shapes) share one artifact, so they calibrate alike: at the dims' example sizes, on
    the stream of the test they size."""
    test_id = case.id
    if case.dynamic is not None:
        test_id = dynamic.seed_id(case.id, case.definition)
        case = dataclasses.replace(case, inputs=tuple(dynamic.at_example(list(case.inputs), case.definition)),
                                   kwargs=dynamic.at_example(dict(case.kwargs), case.definition))
    samples = []
    for k in range(count):
        args, kwargs = sample_inputs(case, calibration_seed(test_id, seed, k))
        drawn = Invocation(args=args, kwargs=kwargs, states=invocation.states)
        samples.append(tensor_inputs(*call_inputs(case, drawn)))
    return samples


def digest(samples: Sequence[Sequence[torch.Tensor]]) -> str:
    """sha256 of the samples' dtypes, shapes and bytes (the first 16 hex digits)."""
    h = hashlib.sha256()
    for sample in samples:
        for t in sample:
            t = t.detach().contiguous().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def save(folder: Path, quantized: Quantized) -> None:
    folder = Path(folder)
    torch.save([t.detach().contiguous().cpu() for t in quantized.reference], folder / REFERENCE_FILE)
    (folder / STEPS_FILE).write_text(json.dumps({"scales": quantized.scales, "calibration": quantized.calibration}))


def load(folder: Path) -> Quantized:
    """The Quantized `save` wrote into `folder`; ValueError when it is missing or not that."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / STEPS_FILE).read_text())
        reference = torch.load(folder / REFERENCE_FILE, weights_only=True)
    except (OSError, ValueError, RuntimeError, EOFError) as exc:
        raise ValueError(f"the artifact's quantized reference cannot be read ({type(exc).__name__}: {exc})") from None
    scales = meta.get("scales") if isinstance(meta, dict) else None
    if (not isinstance(reference, list) or not all(isinstance(t, torch.Tensor) for t in reference)
            or not isinstance(scales, list) or len(scales) != len(reference)
            or not all(s is None or (isinstance(s, (int, float)) and s > 0) for s in scales)):
        raise ValueError("the artifact's quantized reference is not a list of tensors with one positive scale "
                         "(or null) per output")
    return Quantized(reference, [None if s is None else float(s) for s in scales], str(meta.get("calibration", "")))
