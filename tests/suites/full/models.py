import torch


class Scale(torch.nn.Module):
    def __init__(self, features, act=None, factor=1.0):
        super().__init__()
        self.lin = torch.nn.Linear(features, features)
        self.act = act if act is not None else torch.nn.Identity()
        self.factor = factor

    def forward(self, x):
        return self.act(self.lin(x)) * self.factor


class MyLinear(torch.nn.Linear):
    pass
