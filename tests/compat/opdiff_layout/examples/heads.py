"""Heads that import their sibling through the repository root, as opdiff repositories do."""
import torch
from examples.blocks import BlockConfig, ScaledNorm
from torch import nn


class NormHead(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.width, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.out)

    def forward(self, x):
        return self.out(self.norm(torch.relu(self.proj(x))))


class ScaledHead(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.width, cfg.hidden)
        self.norm = ScaledNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.out)

    def forward(self, x):
        return self.out(self.norm(torch.relu(self.proj(x))))
