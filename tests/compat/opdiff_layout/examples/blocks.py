"""Small modules for the opdiff-layout fixture; a config object and two blocks."""
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class BlockConfig:
    width: int
    hidden: int
    out: int
    seed: int = 0


class ScaledNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * gain."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.gain


class Elementwise(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        if self.kind == "abs":
            return torch.abs(x)
        if self.kind == "cube":
            return x * x * x
        return -x
