"""Work for a worker process: the Task protocol the pool runs, what the pools read of a
task or a result beyond it, the context a task runs in, and the Outcome of running a test
on a backend (runner.Job is that task).

Every piece of user code (a suite's `file:` modules, its dotted paths, sampling that
constructs modules) runs inside a task, so only a worker can be taken down by it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from .bundling import Bundled

from ..backends.base import Delegation, Preset, Quantized
from ..core.trees import Structure
from ..core.verdicts import Verdict
from ..suite.model import Invocation, RecordedGrads
from .op_support import Survey


@dataclass(frozen=True)
class WorkerContext:
    """What a task may know about the process running it."""

    threads: int = 0          # intra-op threads this worker runs with (torch's are set already)
    cache_dir: Path | None = None   # this machine's artifact cache, for jobs that use one


class Task(Protocol):
    """What the worker pool runs. Picklable; `run` executes in a worker (or, in-process
    mode, here); `failed` builds the result of a task whose worker crashed, timed out or
    could not take it. What else the pools read of a task or of its result, where it has
    it, is declared below (ForPreset, WithCache; Explained, Stamped, RanOnNode)."""

    key: str

    def run(self, context: WorkerContext) -> Any: ...

    def failed(self, status: Verdict, error_class: str | None, message: str) -> Any: ...


@runtime_checkable
class ForPreset(Protocol):
    """A task for one preset: the Ray executor sends it to a node that has what the
    preset needs (registry.requirements). Tasks without one run on any node."""

    @property
    def preset(self) -> Preset | None: ...


@runtime_checkable
class WithCache(Protocol):
    """A task that uses an artifact cache (None: none): the Ray executor gives each node
    its own view of it (ray_node.node_cache)."""

    @property
    def cache_dir(self) -> Path | str | None: ...


@runtime_checkable
class Explained(Protocol):
    """A result that says how it failed: when `status` is a stage failure, the worker
    appends to `error_message` what the backend printed meanwhile (runtimes often say why
    only on stderr)."""

    status: Verdict | None
    error_message: str | None


@runtime_checkable
class Stamped(Protocol):
    """A result that records the worker process that produced it (the pools set it)."""

    worker_pid: int | None


@runtime_checkable
class RanOnNode(Protocol):
    """A result that records the Ray node that produced it (the Ray executor sets it)."""

    worker_node: str | None


@dataclass
class Outcome:
    """What the backend did. `status` is None when it ran and produced `outputs`
    (to be compared); otherwise a failure verdict (EXPORT_FAIL, LOAD_FAIL, INFER_FAIL,
    CRASH, TIMEOUT, UNAVAILABLE) with the error."""

    key: str
    status: Verdict | None
    outputs: list[torch.Tensor] | None = None     # flat, on CPU, floating ones in the golden's dtypes
    output_structure: Structure = None            # trees.flatten structure of the outputs
    export_ms: float | None = None
    load_ms: float | None = None
    infer_ms: float | None = None                 # median of infer_ms_all
    infer_ms_all: list[float] = field(default_factory=list)
    error_class: str | None = None
    error_message: str | None = None
    cache_hit: bool = False
    batch: int | None = None         # its artifact came from one exporter call for this many tests
    worker_pid: int | None = None
    worker_node: str | None = None   # the Ray node that ran it (execution/ray_pool.py)
    # with Job.reference: the float64 outputs, flat like `outputs` (None for an output
    # that is not floating or already float64), or why there are none
    reference: list[torch.Tensor | None] | None = None
    reference_note: str | None = None
    # with Job.elementwise / Job.control (execution/references.py), flat like `outputs`
    elementwise: list[torch.Tensor | None] | None = None
    control: list[torch.Tensor] | None = None
    control_note: str | None = None
    invocation: Invocation | None = None   # the one the worker materialised (record)
    # Job.grads' result: recorded (record) or recomputed, nested (check: compute_grads)
    grads: RecordedGrads | dict[str, Any] | None = None
    grads_error: str | None = None
    # a check job that failed to lower: what lowering its ops alone found
    survey: Survey | None = None
    delegation: Delegation | None = None   # what a delegating backend took
    delegation_error: str | None = None    # why that could not be read (never taken as delegated)
    quantized: Quantized | None = None     # an int8 preset's quantized reference and output steps
    bundled: Bundled | None = None         # Job.bundle: where its artifact and inputs went
