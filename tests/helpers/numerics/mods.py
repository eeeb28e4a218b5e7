"""Modules for the numerics suite: functional ops inside forward, as real model code has."""

import torch
from torch import nn


class TanhMLP(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class ExpHead(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return torch.exp(self.body(x) * 0.25)


class ManualTanh(nn.Module):
    """tanh written with exp, as some model code does."""

    def forward(self, x):
        e = torch.exp(2.0 * x)
        return (e - 1.0) / (e + 1.0)


class CallTanh(nn.Module):
    def forward(self, x):
        return torch.tanh(x)


class Gate(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return x * torch.sigmoid(self.proj(x))


class FloorAt(nn.Module):
    """max(x, floor) with the floor a buffer: a clamp written with torch.maximum."""

    def __init__(self, floor: float = -0.5):
        super().__init__()
        self.register_buffer("floor", torch.tensor(floor))

    def forward(self, x):
        return torch.maximum(x, self.floor)


class NormBlock(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return self.fc(self.norm(x)) + x


class WideMLP(nn.Module):
    """Products over 512 and 256 terms: float16's own rounding shows in every output."""

    def __init__(self, width: int = 512):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(width, 256), nn.GELU(), nn.Linear(256, 64))

    def forward(self, x):
        return self.body(x)


class Attention(nn.Module):
    """One self-attention block (batched products, softmax, a residual and a norm)."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        out, _ = self.attn(x, x, x, need_weights=False)
        return self.norm(x + out)


class QuantMLP(nn.Module):
    """Linear-ReLU-Linear: what every int8 quantizer takes whole."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class QuantConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))

