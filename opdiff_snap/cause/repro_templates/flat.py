"""The call a repro script reproduces as a module of tensors only (the writer generates
`make_args` for the call just before it)."""

from typing import TYPE_CHECKING

import torch

from .compare import flatten

if TYPE_CHECKING:   # what the writer generates
    from .generated import make_args

# ---------------------------------------------------------------- script text


class Flat(torch.nn.Module):
    """The call as a module taking only tensors and returning a flat tuple of tensors."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *t):
        args, kwargs = make_args(t)
        return tuple(flatten(self.inner(*args, **kwargs)))
