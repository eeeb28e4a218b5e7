"""A module that cannot be imported where OPDIFF_TEST_NOT_HERE is set. The Ray executor
tests set it for the command they run (and so for its local workers) but not for the
cluster's nodes: a command whose jobs import this succeeds only when they ran on the
cluster."""

import os

import torch

if os.environ.get("OPDIFF_TEST_NOT_HERE"):
    raise ImportError("where.py was imported on the machine that runs the command, not on a Ray node")


class Cube(torch.nn.Module):
    def forward(self, x):
        return x * x * x
