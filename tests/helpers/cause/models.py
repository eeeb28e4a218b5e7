"""Fixture modules for the cause tests (localize, repro, gradients)."""

from __future__ import annotations

import torch
from torch import nn


class Scale(nn.Module):
    """A leaf with its own parameter: y = x * w (elementwise)."""

    def __init__(self, n: int):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * self.w


class Net(nn.Module):
    """Several sublayers in a known execution order; `act` is called twice."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(n, 16)
        self.act = nn.Tanh()
        self.norm = nn.LayerNorm(16)
        self.scale = Scale(16)
        self.fc2 = nn.Linear(16, n)

    def forward(self, x, bias: float = 0.0):
        h = self.act(self.fc1(x))
        h = self.scale(self.norm(h))
        return self.act(self.fc2(h)) + bias


class _Cube(torch.autograd.Function):
    """y = x**3 with a hand-written backward; `wrong` drops the factor 3."""

    @staticmethod
    def forward(ctx, x, wrong: bool):
        ctx.save_for_backward(x)
        ctx.wrong = wrong
        return x ** 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        factor = 1.0 if ctx.wrong else 3.0
        return g * factor * x ** 2, None


class CubeGood(nn.Module):
    """Linear followed by the cube function with a correct backward."""

    wrong = False

    def __init__(self, n: int = 4):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return _Cube.apply(self.fc(x), self.wrong)


class CubeBad(CubeGood):
    """The same with a deliberately wrong backward."""

    wrong = True


# ---------------------------------------------------------------- functional ops in forward (localize --ops)

class TanhMLP(nn.Module):
    """A functional tanh between two Linear layers."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(n, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.tanh(h)  # <- tanh
        return self.fc2(h)


class ExpHead(nn.Module):
    """exp after a stack of layers."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n, 16), nn.ReLU(), nn.Linear(16, 16), nn.LayerNorm(16),
                                  nn.Linear(16, 4))

    def forward(self, x):
        return torch.exp(self.body(x) * 0.25)  # <- exp


class SiluGate(nn.Module):
    """Its own forward calls sigmoid between two children."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.inp, self.out = nn.Linear(n, 16), nn.Linear(16, n)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h * torch.sigmoid(h))  # <- sigmoid


class Outer(nn.Module):
    """The bad op sits in a submodule's own forward; every leaf around it passes."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.pre, self.block, self.post = nn.Linear(n, n), SiluGate(n), nn.Linear(n, 4)

    def forward(self, x):
        return self.post(torch.relu(self.block(self.pre(x))))


class Affine(nn.Module):
    """Linear, then a scale and a shift: a multiply feeding an add, which backends fuse."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.gamma = nn.Parameter(torch.linspace(0.5, 1.5, n))
        self.beta = nn.Parameter(torch.linspace(-1.0, 1.0, n))

    def forward(self, x):
        h = self.fc(x)
        h = h * self.gamma + self.beta  # <- mul feeding add
        return torch.relu(h).sum(dim=-1)


class Functional(nn.Module):
    """No submodule at all: its forward is functional code only."""

    def forward(self, x):
        h = x * 0.5 + 1.0
        return torch.tanh(h) * 2.0  # <- functional tanh
