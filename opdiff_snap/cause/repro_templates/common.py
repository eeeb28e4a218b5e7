"""What every repro script defines first: the preset's dtype and device, and the cast
of a reduced-precision preset."""

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:   # what the writer generates
    from .generated import PRESET

# ---------------------------------------------------------------- script text

DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[PRESET["precision"]]
DEVICE = {"gpu": "cuda"}.get(PRESET["device"], PRESET["device"])


def cast(x):
    """A reduced-precision preset casts real floating tensors to its dtype; fp32 keeps them."""
    return x.to(DTYPE) if PRESET["precision"] != "fp32" and x.is_floating_point() else x


def cast_module(module):
    for t in list(module.parameters()) + list(module.buffers()):
        t.data = cast(t.data)
    return module
