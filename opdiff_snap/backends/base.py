"""The one protocol every backend family implements.

A backend receives a *flat* module: `module(*tensors) -> tuple[Tensor, ...]`, with every
non-tensor argument already baked in as a constant and the module's weights already
loaded (see opdiff_snap.execution.prepare). It only has to export, load and run that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # torch is imported where a backend runs, not where presets are named
    import torch

Runnable = Callable[[Sequence["torch.Tensor"]], Sequence["torch.Tensor"]]

PRECISION_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

# What a preset may need from the machine it runs on beyond a CPU (Backend.requires). A
# Ray node advertises each as a custom resource of the same name (docs/distributed.md);
# a plugin may name needs of its own the same way.
MACOS = "macos"
APPLE_SILICON = "apple_silicon"
CUDA = "cuda"


@dataclass(frozen=True)
class Preset:
    """A named backend configuration: `<family>_<device>_<precision>` plus resolved options."""

    name: str
    family: str
    device: str
    precision: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, PRECISION_DTYPE_NAMES[self.precision])

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "device": self.device,
                "precision": self.precision, "options": dict(self.options)}


@dataclass(frozen=True)
class Availability:
    can_export: bool
    can_run: bool
    reason: str = ""  # why not, when either is False

    def export_refusal(self) -> str | None:
        """Why this machine cannot export the preset, as a clause for a message (None: it can)."""
        return None if self.can_export else f"this machine cannot export it ({self.reason})"


@dataclass
class Artifact:
    """What export produced. `path` is a directory holding the serialised artifact for
    backends that serialise (those can be cached and loaded in a fresh process);
    `obj` is an in-memory object for those that do not (eager torch, inductor)."""

    path: Path | None = None
    obj: Any = None


@dataclass
class DelegatedOp:
    """One ATen op of a lowered program: how many of its nodes the delegate took and how
    many stayed on the runtime's own kernels, and where those come from in the model."""

    op: str                    # "aten::add.Tensor"
    delegated: int = 0
    fallback: int = 0
    sources: list[str] = field(default_factory=list)   # of the fallback nodes, distinct, first few


@dataclass
class Delegation:
    """How a delegating backend took a program (ExecuTorch with XNNPACK, CoreML, MPS): the
    delegate, how many delegate blobs, and each op's delegated and fallback node counts."""

    delegate: str
    blobs: int = 0
    ops: list[DelegatedOp] = field(default_factory=list)

    @property
    def delegated(self) -> int:
        return sum(o.delegated for o in self.ops)

    @property
    def fallback(self) -> int:
        return sum(o.fallback for o in self.ops)

    @property
    def fraction(self) -> float:
        """The delegated share of the program's op nodes (1.0 for a program without any)."""
        total = self.delegated + self.fallback
        return 1.0 if total == 0 else self.delegated / total

    def fallback_ops(self) -> list[DelegatedOp]:
        return [o for o in self.ops if o.fallback]

    def to_json(self) -> dict[str, Any]:
        return {"delegate": self.delegate, "blobs": self.blobs,
                "ops": [{"op": o.op, "delegated": o.delegated, "fallback": o.fallback, "sources": list(o.sources)}
                        for o in self.ops]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Delegation":
        return cls(str(data.get("delegate", "")), int(data.get("blobs") or 0),
                   [DelegatedOp(str(o["op"]), int(o.get("delegated") or 0), int(o.get("fallback") or 0),
                                list(o.get("sources") or [])) for o in data.get("ops") or []])


@runtime_checkable
class Backend(Protocol):
    # Read-only members, so a plugin may declare them as plain class attributes.
    @property
    def family(self) -> str: ...
    @property
    def devices(self) -> tuple[str, ...]: ...
    @property
    def precisions(self) -> tuple[str, ...]: ...
    @property
    def default_options(self) -> Mapping[str, Any]: ...
    @property
    def serializes(self) -> bool:
        """True: export writes files under `workdir`, cacheable across processes."""
    @property
    def can_differentiate(self) -> bool: ...

    # What a standalone repro script runs for this family (cause/repro.py writes it out):
    # source text defining `export(module, inputs)` and `load(artifact)`, or only
    # `run(module, inputs)`; "" when the family has none, and no script is written for it.
    repro_source: str = ""
    repro_needs: str = ""   # what that script needs installed ("torch, onnxruntime")

    def availability(self, preset: Preset) -> Availability: ...

    def export(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
               preset: Preset, workdir: Path) -> Artifact:
        """`module` and `inputs` are in the golden's dtypes (fp32 usually); a reduced-precision
        preset casts them itself."""

    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        """The runnable takes inputs in the golden's dtypes and returns tensors; floating
        outputs may come back in the preset's precision (the caller casts them back).
        `threads`: the intra-op threads the job may use (0: the runtime's default); torch's
        own thread count is set per worker process, so only other runtimes need it."""

    # Optional: `delegation(artifact, preset) -> Delegation | None`, how a delegating
    # backend took the program (None: it does not delegate, or says nothing); the runner
    # puts it in the result, cached artifacts included.
    # Optional: `requires(preset) -> frozenset[str]`, what the preset needs beyond a CPU
    # (MACOS, APPLE_SILICON, CUDA or a plugin's own names); a backend without it needs
    # nothing more. Only the Ray executor routes on it (execution/ray_pool.py).
