"""Modules with two ops each that a backend cannot take, and one whose op stays off the
XNNPACK delegate, on lines of their own (the tests find each line by its marker comment)."""

import torch


class OnnxGaps(torch.nn.Module):
    """i0 and lgamma: the ONNX exporter has no translation for either."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        a = torch.special.i0(h)            # gap: i0
        b = torch.lgamma(h.abs() + 1.0)    # gap: lgamma
        return a + b


class ExecutorchGaps(torch.nn.Module):
    """digamma: no core ATen decomposition (lowering fails); sort: lowers, but the runtime
    has no kernel for it (loading fails)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        a = torch.digamma(h.abs() + 1.0)          # gap: digamma
        v = torch.sort(h, dim=-1).values          # gap: sort
        return a + v


class CoremlGaps(torch.nn.Module):
    """diff and xlogy: coremltools has no converter for either on the torch.export path."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(7, 4)

    def forward(self, x):
        h = self.fc(x)
        d = torch.diff(h, dim=-1)                 # gap: diff
        y = torch.xlogy(h.abs(), h.abs() + 1.0)   # gap: xlogy
        return self.out(d + y[..., 1:])


class Fallback(torch.nn.Module):
    """cumsum: XNNPACK does not take it, the portable kernels run it; the rest delegates."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        c = torch.cumsum(h, dim=-1)               # off the delegate: cumsum
        return torch.relu(c + h)
