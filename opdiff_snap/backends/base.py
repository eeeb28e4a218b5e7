"""The surface every backend family implements (`Backend`: each member, required or
optional with its default, and its contract), and the values that cross it.

A backend receives a *flat* module: `module(*tensors) -> tuple[Tensor, ...]`, with every
non-tensor argument already baked in as a constant and the module's weights already
loaded (see opdiff_snap.execution.prepare). It only has to export, load and run that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

if TYPE_CHECKING:  # torch is imported where a backend runs, not where presets are named
    import torch

    from ..core.limits import Range

Runnable = Callable[[Sequence["torch.Tensor"]], Sequence["torch.Tensor"]]

PRECISION_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
                         # int8 presets take the golden's float32 module and inputs: the
                         # backend's quantizer decides what runs in int8
                         "int8": "float32", "int8pt": "float32", "int8dyn": "float32"}


@dataclass(frozen=True)
class Scheme:
    """How an int8 precision quantizes: weights per output channel or per tensor, and
    activations from calibration (static) or from each input as it runs (dynamic)."""

    per_channel: bool
    dynamic: bool


# int8 (static, per-channel weights), int8pt (static, per-tensor), int8dyn (dynamic
# activations, per-channel weights)
QUANTIZED: Mapping[str, Scheme] = MappingProxyType({
    "int8": Scheme(per_channel=True, dynamic=False),
    "int8pt": Scheme(per_channel=False, dynamic=False),
    "int8dyn": Scheme(per_channel=True, dynamic=True),
})

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

    @property
    def scheme(self) -> Scheme | None:
        """How an int8 preset quantizes (None: it does not): its precision's scheme, weights
        per channel or per tensor as the `per_channel` option says where it is set."""
        base = QUANTIZED.get(self.precision)
        per_channel = self.options.get("per_channel")
        if base is None or per_channel is None:
            return base
        return Scheme(per_channel=bool(per_channel), dynamic=base.dynamic)

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
    quantized_model: Any = None   # a dynamic int8 export's quantized model, kept in memory where nothing is written


@dataclass(frozen=True)
class DynamicDim:
    """An axis an export leaves dynamic: its dim's name (axes that share a name are equal
    in size), the sizes the artifact must accept, and the size the export traces at
    (whichever sized test exports, so that the artifact does not depend on which ran first)."""

    name: str
    low: int
    high: int
    example: int
    step: int = 1      # every size is a multiple of it (the export says so: step * a dim)


Dynamic = tuple[Mapping[int, DynamicDim], ...]
"""Per flat input, the axes an export leaves dynamic ({} for an input of fixed shape)."""


@dataclass
class Piece:
    """One test of a batch compiled in one exporter call (Backend.export_batch): its flat
    module, its example inputs, and how many tensors it returns."""

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    outputs: int


@dataclass
class Quantized:
    """What a quantizing export made beside its artifact: the quantized reference (the
    model after quantization, before lowering, run on the export's example inputs, flat
    like the outputs) and the quantization step of each output: the scale of the
    dequantize that produces it, or None where the output is not quantized (dynamic
    activations, an integer output)."""

    reference: list[torch.Tensor]
    scales: list[float | None]
    calibration: str = ""          # digest of the calibration inputs it was quantized from


class QuantizeFailed(Exception):
    """What `Backend.export_quantized` raises when quantizing itself failed (preparing,
    calibrating, converting), not the export or lowering of the quantized model: its
    verdict is QUANTIZE_FAIL."""


class PiecesFailed(Exception):
    """What `Backend.export_batch` may raise when it can tell which pieces made its call
    fail (indices into its `pieces`): the caller compiles the others again without them."""

    def __init__(self, pieces: Sequence[int], message: str = ""):
        super().__init__(message or f"pieces {list(pieces)} failed the batch")
        self.pieces = list(pieces)


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
    def from_json(cls, data: Any) -> "Delegation":
        """What `to_json` wrote, checked field by field (ValueError says what is not), its
        text cut to TEXT_MAX characters: it is read from artifacts and history that anyone
        may have edited."""
        if not isinstance(data, Mapping):
            raise ValueError(f"delegation evidence must be a mapping, not {type(data).__name__}")
        ops = data.get("ops") or []
        if not isinstance(ops, list) or len(ops) > OPS_MAX:
            raise ValueError(f"its ops must be a list of at most {OPS_MAX} entries")
        out = cls(_text(data.get("delegate", ""), "delegate"), _count(data.get("blobs"), "blobs"))
        for o in ops:
            if not isinstance(o, Mapping):
                raise ValueError(f"an op entry is a {type(o).__name__}, not a mapping")
            sources = o.get("sources") or []
            if not isinstance(sources, list):
                raise ValueError("an op entry's sources must be a list")
            out.ops.append(DelegatedOp(_text(o.get("op"), "op"), _count(o.get("delegated"), "delegated"),
                                       _count(o.get("fallback"), "fallback"),
                                       [_text(x, "source") for x in sources[:SOURCES_MAX]]))
        return out


TEXT_MAX, OPS_MAX, SOURCES_MAX = 300, 10_000, 20


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"its {name} is a {type(value).__name__}, not text")
    return value if len(value) <= TEXT_MAX else value[:TEXT_MAX] + f" [... {len(value) - TEXT_MAX} more characters]"


def _count(value: Any, name: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"its {name} is {value!r}, not a count")
    return value


REQUIRED_METHODS: list[str] = []
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _required(method: _Method) -> _Method:
    """Marks a method of Backend that every backend defines itself (the base's only raises,
    or stands on another member: surface.STANDS_IN)."""
    REQUIRED_METHODS.append(method.__name__)
    return method


class Backend:
    """The surface every backend family implements, declared in one place.

    Required: the attributes without a value below (plain class attributes will do) and
    the methods marked required. Optional: every other public member, with the default
    it has here. A third-party backend subclasses this class, or defines the same members
    on an object of its own: the registry checks either against this declaration when
    its entry point loads (`surface.surface_problem`), and sees a plain object through
    `surface.PluginBackend`, so that callers use every member without asking whether it is there.
    """

    family: str
    """The first part of its preset names, `<family>_<device>_<precision>`; unique."""
    devices: tuple[str, ...]
    """The devices its presets name (at least one)."""
    precisions: tuple[str, ...]
    """The precisions its presets name (at least one): fp32, fp16, bf16."""
    default_options: Mapping[str, Any]
    """Every option a user may override, with its default (JSON values)."""
    serializes: bool
    """True: export writes files under `workdir`, cacheable across processes."""
    can_differentiate: bool
    """Whether gradient parity runs on its presets (recomputed through eager torch or
    torch.compile in the worker)."""

    option_aliases: Mapping[str, str] = MappingProxyType({})
    """Other names users may give an option by (opdiff's older spellings): alias -> option.
    Default: none."""
    option_ranges: Mapping[str, Range] = MappingProxyType({})
    """The range of a numeric option, by option name. Default: none (every number must
    still be finite, and whole where the default is a whole number)."""
    repro_source: str = ""
    """The source text a standalone repro script runs the module with: the family's own
    steps `export(module, inputs) -> artifact` and `load(artifact) -> run(inputs)`, or a
    single `run(module, inputs)`; it may use torch, the runtime and the script's names
    (PRESET, DEVICE, DTYPE, cast, cast_module). Default "": no repro template."""
    repro_needs: str = ""
    """What that script needs installed, as a line for its header ("torch, onnxruntime").
    Default "": nothing named."""

    bundle_runner: str = ""
    """The runner script in `opdiff_snap/bundle_runners/` that runs this family's artifacts
    with only its runtime and NumPy, where `opdiff bundle` can ship them to a device
    (run_onnx.py, say). Default "": its presets cannot be bundled."""

    @_required
    def availability(self, preset: Preset) -> Availability:
        """Whether this machine can export and run `preset`, and why not. Cheap checks
        only: no runtime import beyond what naming presets needs."""
        raise NotImplementedError

    @_required
    def export(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
               preset: Preset, workdir: Path) -> Artifact:
        """`module` and `inputs` are in the golden's dtypes (fp32 usually); a reduced-precision
        preset casts them itself. Required, unless the backend defines `export_dynamic`:
        then the default is that with no axis dynamic."""
        if not self._has("export_dynamic"):
            raise NotImplementedError
        return self.export_dynamic(module, inputs, (), preset, workdir)

    @_required
    def load(self, artifact: Artifact, preset: Preset, threads: int = 0) -> Runnable:
        """The runnable takes inputs in the golden's dtypes and returns tensors; floating
        outputs may come back in the preset's precision (the caller casts them back).
        `threads`: the intra-op threads the job may use (0: the runtime's default); torch's
        own thread count is set per worker process, so only other runtimes need it."""
        raise NotImplementedError

    def preset_options(self, device: str, precision: str) -> Mapping[str, Any]:
        """Option values that follow from a preset's name (ONNX's execution provider, say),
        applied over `default_options` and under the user's overrides. Default: none."""
        return {}

    def requires(self, preset: Preset) -> frozenset[str]:
        """What `preset` needs from a machine beyond a CPU: MACOS, APPLE_SILICON, CUDA or
        names of the plugin's own. Only the Ray executor routes on it. Default: nothing."""
        return frozenset()

    def prepare_runtime(self, preset: Preset) -> None:
        """Import what loading and running `preset`'s artifacts needs (not the exporter), so
        that a worker pays it before its first job and `load_ms` times the load alone.
        Default: nothing."""

    def device_feed(self, preset: Preset, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors a runtime is fed for these inputs, as `load`'s runnable feeds them
        (cast to the precision it exports in, contiguous, on the CPU): what a bundle stores
        for a device to replay. Default: the inputs, contiguous on the CPU."""
        return [t.detach().cpu().contiguous() for t in inputs]

    def batches(self, preset: Preset) -> bool:
        """Whether `export_batch` can compile several tests of `preset` in one exporter
        call. Default False: each test is exported alone."""
        return False

    def export_batch(self, pieces: Sequence[Piece], preset: Preset, workdir: Path) -> list[Artifact | None]:
        """Export every piece in one exporter call (each piece on its own inputs, nothing
        shared between them) and give each its own artifact in its own folder under
        `workdir`, loadable alone exactly like `export`'s: the list holds one per piece, in
        order, None where that piece's artifact could not be made (it is then exported
        alone). Raises PiecesFailed when the call fails and the backend can tell which
        pieces made it fail, anything else when it cannot (the caller halves the batch).
        Called only where `batches` is True."""
        raise NotImplementedError(f"the {self.family} backend does not compile batches")

    def batch_timed_alone(self, preset: Preset) -> bool:
        """Whether a test's artifact from `export_batch` runs that test alone, so that its
        timed calls are its own latency. Default True. False: it runs its whole batch in
        one call (one program for all), and such a result carries no `infer_ms`."""
        return True

    def offers(self, device: str, precision: str) -> bool:
        """Whether `<family>_<device>_<precision>` is a preset at all (int8 on a device whose
        delegate has no quantizer is not). Default True: every device at every precision."""
        return True

    def quantizes(self, preset: Preset) -> bool:
        """Whether `preset` quantizes: its export is `export_quantized`, and its results are
        judged against the quantized reference. Default: where its precision is an int8
        one (`Preset.scheme`) and the backend defines `export_quantized`, or `quantize`
        and `lower_quantized`."""
        return preset.scheme is not None and (self._has("export_quantized") or self._halves())

    def export_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                         calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset,
                         workdir: Path, dims: Dynamic = ()) -> tuple[Artifact, Quantized]:
        """Quantize `module` from the `calibration` inputs (each a tuple like `inputs`), run
        the quantized model before lowering on `inputs` (the quantized reference), then
        export and lower it as `export` does. Raises QuantizeFailed when quantizing fails.
        Called only where `quantizes` is True; the caller keeps the Quantized with the
        artifact. `dims` (passed only where the backend defines `quantized_reference`): the
        axes the quantized model and its artifact leave dynamic, as `export_dynamic` does.
        Default: `quantize`, then `lower_quantized`."""
        if not self._halves():
            raise NotImplementedError(f"the {self.family} backend does not quantize")
        _, artifact, quantized = self._quantize_then_lower(module, inputs, calibration, preset, workdir, dims)
        return artifact, quantized

    def _quantize_then_lower(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                             calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset,
                             workdir: Path, dims: Dynamic) -> tuple[torch.nn.Module, Artifact, Quantized]:
        """`quantize`, then `lower_quantized`: the quantized module, its artifact, its Quantized.
        `dims` reach the two only for a dynamic export (a plugin written for static shapes takes none)."""
        shape = {"dims": dims} if dims else {}
        quantized_module, quantized = self.quantize(module, inputs, calibration, preset, **shape)
        return quantized_module, self.lower_quantized(quantized_module, inputs, preset, workdir, **shape), quantized

    def quantize(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                 calibration: Sequence[tuple[torch.Tensor, ...]], preset: Preset,
                 dims: Dynamic = ()) -> tuple[torch.nn.Module, Quantized]:
        """With `lower_quantized`, the two halves of `export_quantized` for a backend whose
        quantized model is a torch module (PT2E's converted graph): that module and its
        Quantized on `inputs`; raises QuantizeFailed. localize steps through the module's
        graph, lowering parts of it. int8_quantizers.PT2EBackend defines both halves from a
        PT2E quantizer."""
        raise NotImplementedError(f"the {self.family} backend has no quantized torch model")

    def lower_quantized(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], preset: Preset,
                        workdir: Path, dims: Dynamic = ()) -> Artifact:
        """With `quantize`: lower a module `quantize` made, or a graph cut out of one,
        exactly as `export_quantized` lowers the whole."""
        raise NotImplementedError(f"the {self.family} backend has no quantized torch model")

    def quantized_reference(self, artifact: Artifact, inputs: tuple[torch.Tensor, ...],
                            preset: Preset) -> list[torch.Tensor]:
        """The quantized model `export_quantized` made with `dims`, kept with its artifact,
        run on `inputs` of any size in range: a sized test's quantized reference, whichever
        sized test made the artifact. Defining it is what lets an int8 preset export dynamic
        shapes (`dynamic_refusal`). Default: not defined."""
        raise NotImplementedError(f"the {self.family} backend keeps no quantized model to rerun")

    def steps_through_quantized(self, preset: Preset) -> bool:
        """Whether localize can step through `preset`'s quantized model (`quantize` and
        `lower_quantized` both defined for it)."""
        return self.quantizes(preset) and self._halves()

    def _halves(self) -> bool:
        return self._has("quantize") and self._has("lower_quantized")

    def _has(self, name: str) -> bool:
        """Whether this backend defines the member `name` itself (not Backend's default)."""
        return getattr(type(self), name) is not vars(Backend)[name]

    def export_dynamic(self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], dims: Dynamic,
                       preset: Preset, workdir: Path) -> Artifact:
        """Export as `export` does, with the axes `dims` names left dynamic: the artifact then
        takes inputs of any size in each dim's range. Called only where `dynamic_refusal`
        is None. Default: not defined (the preset exports static shapes only)."""
        raise NotImplementedError(f"the {self.family} backend does not export dynamic shapes")

    def dynamic_refusal(self, preset: Preset) -> str | None:
        """Why `preset` cannot export dynamic shapes (the verdict of a dynamic test says
        it), or None when `export_dynamic` serves it. Default: None where the backend
        defines `export_dynamic` and, for a quantizing preset, `quantized_reference`."""
        if not self._has("export_dynamic"):
            return f"the {self.family} backend exports static shapes only"
        if self.quantizes(preset) and not self._has("quantized_reference"):
            return (f"the {self.family} backend keeps no quantized model to judge each size against "
                    "(it defines no quantized_reference)")
        return None

    def delegates(self, preset: Preset) -> bool:
        """Whether the preset hands programs to a delegate, so that `--require-delegated`
        has something to hold it to. Default False."""
        return False

    def delegation(self, artifact: Artifact, preset: Preset) -> Delegation | None:
        """How a delegating backend took the exported program; the runner puts it in the
        result, cached artifacts included. Default None: it does not delegate, or says
        nothing. Raises when the evidence is there but unreadable (the runner rebuilds a
        cached artifact once, then says so)."""
        return None
