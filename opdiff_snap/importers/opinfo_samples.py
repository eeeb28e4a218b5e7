"""OpInfo's samples chosen and written as tests: each op's samples drawn under a seed of
its own, and each sample made a TorchCall test where the suite format can say it exactly
(importers/opinfo.py, which writes them out and keeps what reproduces), or the reason it
cannot be one.
"""

from __future__ import annotations

import fnmatch
import random
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from ..core.errors import OpdiffError
from ..core.trees import flatten
from ..suite.fields import DTYPES as GOLDEN_DTYPES
from ..suite.profiles import NORMAL
from ..suite.torch_call import Unencodable, decode, encode, resolve_fn

TORCH_CALL = "opdiff_snap.suite.torch_call.TorchCall"
# why a golden of these outputs would prove nothing (all zero, all NaN, one value), or None;
# the caller's rule (compare/vacuous.py through the API), so this module stays a suite writer
ProvesNothing = Callable[[Any], "str | None"]
VACUOUS = "its golden would prove nothing (outputs all near zero, all NaN/Inf, or one repeated value)"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# outputs that are whatever memory held: the same bits twice proves nothing
UNINITIALISED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


@dataclass
class OpRow:
    """What became of one op: samples kept per dtype, and why others were not."""

    name: str                                             # with its variant: index_reduce.amax
    op: str = ""                                          # without: index_reduce
    fn: str = ""
    kept: Counter = field(default_factory=Counter)        # dtype -> samples
    skipped: Counter = field(default_factory=Counter)     # reason -> samples
    dropped_profiles: Counter = field(default_factory=Counter)  # profile -> samples left without it
    reason: str = ""                                      # why the op gave nothing at all


@dataclass
class Sample:
    """One sample as a test: its test, its input tensors, the output they gave, its op's row."""

    test: dict
    tensors: list[torch.Tensor]
    output: list[torch.Tensor]
    row: OpRow


def full_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def op_database() -> list:
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except Exception as exc:  # torch built without its testing package, or it failed to import
        raise OpdiffError(f"torch's OpInfo database cannot be imported here ({type(exc).__name__}: {exc}); "
                          "it ships with torch's own wheels (torch.testing._internal): use one.") from exc
    return list(op_db)


def callable_path(op) -> str | None:
    """How a suite names what OpInfo calls: `torch.<name>` when that is the very function,
    else the Tensor method OpInfo also knows; None for a wrapper of torch's test code."""
    path = op.name if op.name.startswith("torch.") else "torch." + op.name   # torch.ops.aten.x.default
    obj: Any = torch
    for part in path.split(".")[1:]:
        obj = getattr(obj, part, None)
        if obj is None:
            break
    if obj is not None and obj is op.op:
        return path
    if getattr(torch.Tensor, op.name, None) is op.op:
        return "Tensor." + op.name
    method = op.method_variant
    name = getattr(method, "__name__", None)
    if method is not None and name and getattr(torch.Tensor, name, None) is method:
        return "Tensor." + name
    return None


def _seed(name: str, dtype: str) -> None:
    s = zlib.crc32(f"{name}/{dtype}".encode())
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)


def same_values(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
        and torch.equal(x.isnan(), y.isnan()) for x, y in zip(a, b))


def output_tensors(value: Any) -> list[torch.Tensor]:
    _, leaves = flatten(value, "the output")
    return [t.detach().clone() for t in leaves]


def _input_node(t: torch.Tensor) -> dict:
    dtype = str(t.dtype).removeprefix("torch.")
    values = t.detach().to(torch.float32 if t.dtype == torch.bfloat16 else t.dtype).numpy()
    if t.dim() == 0:
        return {"type": "scalar_tensor", "dtype": dtype, "value": values.item() if dtype == "bool" else values[()]}
    return {"type": "const_tensor", "shape": list(t.shape), "dtype": dtype,
            "value": values if t.numel() else []}


def _call(fn: Callable, form_args: list, form_kwargs: dict, tensors: list[torch.Tensor]) -> Any:
    inputs = tuple(t.clone() for t in tensors)
    return fn(*decode(form_args, inputs, "sample"), **{k: decode(v, inputs, "sample") for k, v in form_kwargs.items()})


def pointwise(op) -> bool:
    """Whether an OpInfo entry is an elementwise op (a unary or binary ufunc): the ops
    whose samples an input profile's values exercise element by element."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, UnaryUfuncInfo

    return isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo))


def _sample_test(row: OpRow, fn: Callable, fn_path: str, sample, test_id: str, dtype: str,
                 max_elements: int, profiles: Sequence[str] = (),
                 proves_nothing: ProvesNothing | None = None) -> Sample | str:
    """The test of one sample, or why it cannot be one."""
    tensors: list[torch.Tensor] = []
    try:
        args = [encode(sample.input, tensors)] + [encode(a, tensors) for a in sample.args]
        kwargs = {k: encode(v, tensors) for k, v in sample.kwargs.items()}
    except Unencodable as exc:
        return f"{exc} (the suite format holds tensors, numbers, strings, dtypes and lists)"
    if not tensors:
        return "no tensor argument"
    if any(t.is_complex() for t in tensors):
        return "complex tensor argument"
    if any(t.layout != torch.strided or t.is_quantized for t in tensors):
        return "sparse or quantized tensor argument"
    if sum(t.numel() for t in tensors) > max_elements:
        return f"more than {max_elements} input elements"
    tensors = [t.detach().contiguous() for t in tensors]
    try:
        first = output_tensors(_call(fn, args, kwargs, tensors))
        again = output_tensors(_call(fn, args, kwargs, tensors))
    except Exception as exc:
        return f"calling it raised {type(exc).__name__}"
    if not first:
        return "output holds no tensor"
    if any(t.layout != torch.strided for t in first):
        return "sparse output"
    odd = sorted({str(t.dtype).removeprefix("torch.") for t in first} - set(GOLDEN_DTYPES))
    if odd:
        return f"output dtype {odd[0]}, which a golden does not hold"
    if not same_values(first, again):
        return "output differs between two calls (random)"
    if proves_nothing is not None and proves_nothing([t.resolve_conj() for t in first]):
        return VACUOUS
    test = {"id": test_id,
            "op": {"type": "module", "path": TORCH_CALL,
                   "kwargs": {"fn": fn_path, "args": args, **({"kwargs": kwargs} if kwargs else {})}},
            "in": [_input_node(t) for t in tensors],
            **({"profiles": [NORMAL, *profiles]} if profiles else {}),
            "tags": ["opinfo", dtype]}
    return Sample(test, tensors, first, row)


def _sanitize(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def collect(ops: Sequence[str] = (), dtypes: Sequence[str] = ("float32",), max_samples: int = 2,
            max_elements: int = 256, progress: Callable[[str], None] | None = None,
            profiles: Sequence[str] = (), profile_dtypes: Sequence[str] | None = None,
            proves_nothing: ProvesNothing | None = None) -> list[Sample | OpRow]:
    """Samples to write and a row per op (in op_db order); the samples of elementwise ops
    carry `profiles` (input profiles beyond normal) too, in `profile_dtypes` (None: all).
    A sample whose output `proves_nothing` is skipped, and the next one taken."""
    for d in dtypes:
        if d not in DTYPES:
            raise OpdiffError(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}.")
    db = op_database()
    chosen = [op for op in db if not ops or any(fnmatch.fnmatchcase(full_name(op), g) for g in ops)]
    if ops and not chosen:
        raise OpdiffError(f"--ops {';'.join(ops)}: no OpInfo entry matches; names look like add, "
                          "nn.functional.conv2d or linalg.norm (globs allowed).")
    out: list[Sample | OpRow] = []
    used: set[str] = set()
    for op in chosen:
        name = full_name(op)
        row = OpRow(name, op.name)
        out.append(row)
        fn_path = callable_path(op)
        if op.name in UNINITIALISED:
            row.reason = "its output is uninitialised memory"
            continue
        if fn_path is None:
            row.reason = "it calls a wrapper in torch's test code, not an importable torch function"
            continue
        row.fn = fn_path
        fn = resolve_fn(fn_path)
        elementwise = pointwise(op)
        supported = op.supported_dtypes("cpu")
        for dtype in dtypes:
            if DTYPES[dtype] not in supported:
                continue
            if progress:
                progress(f"{name} {dtype}")
            _seed(name, dtype)
            kept = 0
            try:
                samples: Iterable = op.sample_inputs("cpu", DTYPES[dtype], requires_grad=False)
                for k, sample in enumerate(samples):
                    if kept >= max_samples or k >= 8 * max_samples:
                        break
                    test_id = _sanitize(f"opinfo.{name}.{SHORT[dtype]}.{k}")
                    if test_id in used:
                        row.skipped["duplicate id"] += 1
                        continue
                    own = profiles if elementwise and (profile_dtypes is None or dtype in profile_dtypes) else ()
                    made = _sample_test(row, fn, fn_path, sample, test_id, dtype, max_elements, own,
                                        proves_nothing)
                    if isinstance(made, str):
                        row.skipped[made] += 1
                        continue
                    used.add(test_id)
                    out.append(made)
                    kept += 1
            except Exception as exc:  # OpInfo's own sample generator failed here
                row.skipped[f"OpInfo's sample generator raised {type(exc).__name__}"] += 1
    return out

