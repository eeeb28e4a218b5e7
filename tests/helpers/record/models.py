"""`file:` modules for the record tests (copied into each tmp project's suites/)."""

import torch
from torch import nn


class Nested(nn.Module):
    """Parameters, a float buffer, an int buffer, and nested outputs (tuple, list, dict)."""

    def __init__(self, n: int = 4):
        super().__init__()
        self.lin = nn.Linear(n, 3)
        self.register_buffer("scale", torch.linspace(0.5, 2.0, 3))
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))

    def forward(self, x, mask):
        y = self.lin(x) * self.scale
        return y, [y.sum(0), {"masked": x.masked_fill(mask, 0.0), "n": self.steps * 2}]


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        raise ValueError("this module always fails in forward")
