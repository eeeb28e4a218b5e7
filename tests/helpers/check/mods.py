"""A `file:` module for tests/helpers/check/edge.yaml (tests edit it to make goldens STALE)."""

import torch


class Scale(torch.nn.Module):
    def __init__(self, k: float):
        super().__init__()
        self.k = k

    def forward(self, x):
        return x * self.k
