"""Small helpers every backend family shares: precision casts, lazy checks.

Nothing here imports more than torch and the standard library; families import their
runtimes lazily inside export/load so that listing presets and asking for availability
stays cheap.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from .base import Dynamic, DynamicDim, Preset

IS_MACOS = sys.platform == "darwin"


def cast_inputs(inputs: Iterable[torch.Tensor], dtype: torch.dtype | None) -> tuple[torch.Tensor, ...]:
    """Cast real floating tensors to `dtype`; integer, bool and complex ones stay as they are."""
    if dtype is None:
        return tuple(inputs)
    return tuple(t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t for t in inputs)


def cast_module(module: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    """A copy of `module` whose floating parameters and buffers are `dtype` (others untouched).

    `nn.Module.to(dtype)` would also touch complex tensors; this only casts real floating ones.
    The caller's module is never modified; its train/eval mode is kept (prepare decides it).
    """
    if dtype is None:
        return module
    module = copy.deepcopy(module)
    module._apply(lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)
    return module


def reduced_dtype(preset: Preset) -> torch.dtype | None:
    """The dtype a reduced-precision preset casts to (None for fp32: keep golden dtypes)."""
    return None if preset.precision == "fp32" else preset.dtype


def as_output_list(out: Any) -> list[torch.Tensor]:
    """Normalise what a flat module returned (tuple, list or a single tensor) to a list."""
    if isinstance(out, torch.Tensor):
        return [out]
    outs = list(out)
    for i, t in enumerate(outs):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flat module output {i} is {type(t).__name__}, expected a Tensor")
    return outs


def thread_budget(option: int | None, threads: int) -> int:
    """Threads a runtime may use: the preset's explicit option, else the job's budget
    (0: the runtime's default)."""
    return int(option) if option else max(0, int(threads))


def has_module(name: str) -> bool:
    """True when `name` is importable, without importing it (or its parent packages'
    heavy `__init__`: a dotted name is resolved on disk below its top-level package)."""
    top, _, rest = name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not rest:
        return True
    roots = list(spec.submodule_search_locations or [])
    parts = rest.split(".")
    for root in roots:
        base = Path(root).joinpath(*parts)
        if base.is_dir() or base.with_suffix(".py").is_file():
            return True
    return False


def single_file(workdir: Path, suffix: str) -> Path:
    """The one file with `suffix` directly in an artifact directory."""
    found = sorted(Path(workdir).glob(f"*{suffix}"))
    if not found:
        raise FileNotFoundError(f"no *{suffix} file in artifact directory {workdir}")
    return found[0]


def contiguous_cpu(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().cpu().contiguous() for t in inputs]


def export_program(module: torch.nn.Module, inputs: Sequence[torch.Tensor], opts: Any,
                   always_decompose: bool, dynamic: Dynamic | None = None) -> Any:
    """torch.export of the (optionally fp16-cast) module on the (cast) inputs, shared by
    the exporters that consume an ExportedProgram. `use_default_decompositions` runs the
    full default table; otherwise `always_decompose` runs an empty one, which coremltools
    needs to get ATen-level ops, while ExecuTorch's lowering decomposes by itself.
    `dynamic`: the axes left dynamic."""
    dtype = torch.float16 if opts.get("export_fp16") else None
    model = cast_module(module, dtype)
    args = tuple(contiguous_cpu(cast_inputs(inputs, dtype)))
    # a graph module (PT2E's quantized model) takes its inputs by name, a flat module as varargs
    shapes = export_dims(dynamic, varargs=not isinstance(module, torch.fx.GraphModule))
    with torch.no_grad():
        program = torch.export.export(model, args, strict=bool(opts.get("export_strict")), dynamic_shapes=shapes)
        if opts.get("use_default_decompositions"):
            return program.run_decompositions()
        return program.run_decompositions({}) if always_decompose else program


def export_dims(dynamic: Dynamic | None, varargs: bool = True) -> tuple[Any, ...] | None:
    """torch.export's `dynamic_shapes` for a flat module (`forward(*tensors)`: one entry,
    for the varargs, holding one per input; `varargs` False: one per input, for a module
    that names its inputs): one torch.export.Dim per dim name (so axes that share a name
    stay equal), None for an input of fixed shape."""
    if dynamic is None:
        return None
    made: dict[str, Any] = {}
    out: list[dict[int, Any] | None] = []
    for axes in dynamic:
        out.append({axis: made[d.name] if d.name in made else made.setdefault(d.name, _export_dim(d))
                    for axis, d in axes.items()} or None)
    return (tuple(out),) if varargs else tuple(out)


def _export_dim(d: DynamicDim) -> Any:
    """A torch.export dim for `d`: with a step, the step times a dim over the quotients."""
    if d.step > 1:
        return d.step * torch.export.Dim(f"{d.name}_over_{d.step}", min=d.low // d.step, max=d.high // d.step)
    return torch.export.Dim(d.name, min=d.low, max=d.high)


def script_source(imports: Sequence[str], constants: Mapping[str, Any], functions: Sequence[Callable[..., Any]],
                  glue: str) -> str:
    """A family's `repro_source` built from the code its run path runs: the imports, the
    constants (as literals), each function's own source, then the glue that calls them as
    the family's export and load do. The functions may use only torch, the runtime, the
    constants and each other, so the script runs them without this package."""
    parts = ["\n".join(imports), "\n".join(f"{name} = {value!r}" for name, value in constants.items())]
    parts += [inspect.getsource(f).rstrip("\n") for f in functions]
    return "\n" + "\n\n\n".join(p for p in parts if p) + "\n" + glue


class Pieces(torch.nn.Module):
    """Several flat modules as one, for an exporter call that compiles a batch of tests:
    forward takes every piece's inputs one after the other and returns every piece's
    outputs one after the other. Nothing flows between pieces."""

    def __init__(self, modules: Sequence[torch.nn.Module], arity: Sequence[int]):
        super().__init__()
        self.pieces = torch.nn.ModuleList(modules)
        self.arity = list(arity)
        self.training = any(m.training for m in modules)   # each piece keeps the mode it was given

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs: list[torch.Tensor] = []
        start = 0
        for module, n in zip(self.pieces, self.arity):
            outs.extend(as_output_list(module(*args[start:start + n])))
            start += n
        return tuple(outs)


def pieces_at_fault(exc: BaseException) -> list[int]:
    """The pieces of a `Pieces` module whose graph nodes an exporter was working on when it
    raised `exc` (or the exceptions it chains): the FX nodes among the local variables of
    the frames it unwound, by the module path their metadata records (`pieces.<i>`).
    Empty when it names none; a hint only, never a verdict."""
    found: set[int] = set()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, torch.fx.Node):
                    found |= pieces_of(value)
            tb = tb.tb_next
        current = current.__cause__ or current.__context__
    return sorted(found)


def pieces_of(node: Any) -> set[int]:
    """The pieces of a `Pieces` module a graph node was traced inside, by the module path
    its metadata records (`pieces.<i>`)."""
    import re

    found = set()
    for path, *_ in (node.meta.get("nn_module_stack") or {}).values():
        match = re.match(r"pieces\.(\d+)(\.|$)", str(path))
        if match:
            found.add(int(match.group(1)))
    return found
