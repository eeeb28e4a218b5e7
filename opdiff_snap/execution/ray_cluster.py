"""The Ray cluster as the Ray executor (ray_pool.py) sees it: joining it (or starting a
Ray instance of our own), and each node with the resources it advertises. A node offers
what a preset needs (registry.requirements) when it advertises each as a Ray custom
resource of that name (`ray start --resources '{"cuda": 1}'`; Ray's own GPU resource
counts as cuda) and has CPUs to run jobs on.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from typing import Any

from ..core.errors import OpdiffError

GPU = "GPU"               # Ray's own resource for NVIDIA GPUs: it satisfies "cuda"


@dataclass
class Node:
    """One node of the cluster, as Ray's node table last said."""

    id: str
    host: str
    ip: str
    resources: dict[str, float]
    alive: bool = True

    @property
    def slots(self) -> int:
        return int(self.resources.get("CPU", 0))

    def resource_for(self, need: str) -> str | None:
        if self.resources.get(need, 0) > 0:
            return need
        if need == "cuda" and self.resources.get(GPU, 0) > 0:
            return GPU
        return None

    def offers(self, needs: frozenset[str]) -> bool:
        return self.slots > 0 and all(self.resource_for(n) for n in needs)

    @property
    def label(self) -> str:
        return f"{self.host} ({self.ip}, node {self.id[:12]})"

    def offered(self) -> dict[str, float]:
        """What the node advertises that jobs can use: CPUs, GPUs, custom resources."""
        return {k: v for k, v in sorted(self.resources.items())
                if not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type"))}

    def advertised(self) -> str:
        return f"{self.host} {self.offered()}"


def first_line(exc: BaseException) -> str:
    """The informative line of a Ray error (why an actor or node died, if it says)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    cause = next((ln for ln in lines if "died because" in ln or "terminated" in ln), None)
    return cause or (lines[0] if lines else type(exc).__name__)


def connect(address: str | None, cpus: int):
    """(the ray module, whether we started the instance and stop it at close)."""
    if address is None:
        # A Ray instance of our own listens on loopback only (as Ray does on macOS), and
        # asks for a token of its own, passed to its workers in the environment (Ray would
        # otherwise write one to ~/.ray/auth_token, which later clusters pick up).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        if "RAY_AUTH_MODE" not in os.environ:
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise OpdiffError("--executor ray needs Ray, which is not installed here: pip install "
                          "'opdiff-snap[ray]' (on every node of the cluster too).") from None
    if ray.is_initialized():
        return ray, False   # already connected (an API user's own session): use it, leave it open
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR,
                               "include_dashboard": False}
    try:
        if address is None:
            ray.init(num_cpus=cpus, **options)
        else:
            ray.init(address=address, **options)
    except Exception as exc:
        where = f"join the Ray cluster at {address}" if address else "start a Ray instance here"
        hint = ("Start its head with `ray start --head --port PORT` and give that HOST:PORT, or check "
                "that this machine reaches it" if address else "Run `ray start --head` and use --executor "
                "ray://auto, or use the local executor")
        raise OpdiffError(f"--executor: cannot {where} ({type(exc).__name__}: {first_line(exc)}). {hint}.") from None
    return ray, True
