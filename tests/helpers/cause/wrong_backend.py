"""A deliberately wrong backend: eager torch that adds 1e-2 to every floating output of
any flat module containing a submodule whose class has a chosen name (by name: the
suite imports models.py under its own module name, so class identity would not match). It follows the Backend
protocol (export -> load -> run) like every real family, so localize cannot tell it apart."""

from __future__ import annotations

from opdiff_snap.backends.torch_eager import TorchEagerBackend


class PerturbingBackend(TorchEagerBackend):
    family = "torch"

    def __init__(self, victim: str, delta: float = 1e-2):
        self.victim = victim
        self.delta = delta

    def load(self, artifact, preset, threads=0):
        run = super().load(artifact, preset)
        if not any(type(m).__name__ == self.victim for m in artifact.obj.modules()):
            return run

        def wrong(inputs):
            return [t + self.delta if t.is_floating_point() else t for t in run(inputs)]

        return wrong
