"""What a golden's definition may make a worker run when no suite vouches for it.

A golden is data: it travels between machines and buckets, and anyone who can write to
the store can edit its stored definition, including its `suite` attribute. Only the
suites the user points at (`--suites`, `[tool.opdiff] suites`, `./suites`) vouch for a
test; when `check` (or `repro`, `localize`, `goldens reference`) rebuilds a test from a
golden that none of them defines, the definition may only name

- pure ATen operators (`aten::...`, see `op_refusal`), which resolve through torch.ops,
  and
- the documented torch.nn module classes listed below, as the module under test or as a
  constructor argument, and
- `TorchCall` tests whose function passes the TorchCall rule (suite/torch_fns.py: torch's
  operator functions and Tensor methods).

Anything else (a `file:` module, a dotted path into user code or the standard library,
an ATen operator with effects beyond its result) runs only when one of those suites
defines that test, or when the user passes `--trust-goldens`, which names what it will
run. The class list is explicit, not computed from torch at run time, so a torch upgrade
cannot widen it; operators are judged by what their schema says (`op_refusal`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

import torch

from ..core.errors import OpdiffError
from .construct import resolve_op
from .torch_fns import TORCH_CALL, definition_fns, fn_refusal

TORCH_NN_CLASSES = frozenset(f"torch.nn.{name}" for name in """
    AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveLogSoftmaxWithLoss
    AdaptiveMaxPool1d AdaptiveMaxPool2d AdaptiveMaxPool3d AlphaDropout AvgPool1d AvgPool2d
    AvgPool3d BCELoss BCEWithLogitsLoss BatchNorm1d BatchNorm2d BatchNorm3d Bilinear CELU
    CTCLoss ChannelShuffle CircularPad1d CircularPad2d CircularPad3d ConstantPad1d
    ConstantPad2d ConstantPad3d Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d
    ConvTranspose3d CosineEmbeddingLoss CosineSimilarity CrossEntropyLoss CrossMapLRN2d
    Dropout Dropout1d Dropout2d Dropout3d ELU Embedding EmbeddingBag FeatureAlphaDropout
    Flatten Fold FractionalMaxPool2d FractionalMaxPool3d GELU GLU GRU GRUCell
    GaussianNLLLoss GroupNorm Hardshrink Hardsigmoid Hardswish Hardtanh HingeEmbeddingLoss
    HuberLoss Identity InstanceNorm1d InstanceNorm2d InstanceNorm3d KLDivLoss L1Loss
    LPPool1d LPPool2d LPPool3d LSTM LSTMCell LayerNorm LazyBatchNorm1d LazyBatchNorm2d
    LazyBatchNorm3d LazyConv1d LazyConv2d LazyConv3d LazyConvTranspose1d LazyConvTranspose2d
    LazyConvTranspose3d LazyInstanceNorm1d LazyInstanceNorm2d LazyInstanceNorm3d LazyLinear
    LeakyReLU Linear LinearCrossEntropyLoss LocalResponseNorm LogSigmoid LogSoftmax MSELoss
    MarginRankingLoss MaxPool1d MaxPool2d MaxPool3d MaxUnpool1d MaxUnpool2d MaxUnpool3d Mish
    ModuleDict ModuleList MultiLabelMarginLoss MultiLabelSoftMarginLoss MultiMarginLoss
    MultiheadAttention NLLLoss NLLLoss2d PReLU PairwiseDistance PixelShuffle PixelUnshuffle
    PoissonNLLLoss RMSNorm RNN RNNCell RReLU ReLU ReLU6 ReflectionPad1d ReflectionPad2d
    ReflectionPad3d ReplicationPad1d ReplicationPad2d ReplicationPad3d SELU Sequential SiLU
    Sigmoid SmoothL1Loss SoftMarginLoss Softmax Softmax2d Softmin Softplus Softshrink
    Softsign Tanh Tanhshrink Threshold Transformer TransformerDecoder
    TransformerDecoderLayer TransformerEncoder TransformerEncoderLayer TripletMarginLoss
    TripletMarginWithDistanceLoss Unflatten Unfold Upsample UpsamplingBilinear2d
    UpsamplingNearest2d ZeroPad1d ZeroPad2d ZeroPad3d
""".split())

TRUSTED_OP_NAMESPACES = frozenset({"aten"})


def code_paths(definition: Any) -> Iterator[str]:
    """Every path a definition names: op targets (`aten::add.Tensor`), module and
    construct paths (dotted or `file:`)."""
    if isinstance(definition, dict):
        if definition.get("kind") in ("op", "module") and isinstance(definition.get("target"), str):
            yield definition["target"]
        if definition.get("type") in ("module", "construct") and isinstance(definition.get("path"), str):
            yield definition["path"]
        for value in definition.values():
            yield from code_paths(value)
    elif isinstance(definition, list):
        for value in definition:
            yield from code_paths(value)


# the type kinds of plain values: a schema using any other kind (Generator, Storage,
# Stream, Future, RRef, a custom class, Any) takes or returns an object, not data
DATA_TYPE_KINDS = frozenset({
    "TensorType", "IntType", "SymIntType", "FloatType", "SymFloatType", "ComplexType", "BoolType",
    "SymBoolType", "NumberType", "StringType", "DeviceObjType", "ScalarTypeType", "LayoutType",
    "MemoryFormatType", "NoneType", "OptionalType", "ListType", "TupleType", "DictType", "VarType",
    "AnyEnumType",
})


def _kinds(type_: Any) -> Iterator[str]:
    yield type_.kind()
    for contained in type_.containedTypes():
        yield from _kinds(contained)


def _holds_tensor(type_: Any) -> bool:
    return "TensorType" in _kinds(type_)


def overload_refusal(op: Any) -> str | None:
    """Why one OpOverload is not a pure tensor computation, from its schema and tags, or
    None when it is. In order: it draws on the random number generator (tagged
    `nondeterministic_seeded`, or takes a Generator); an argument or result is not plain
    data; it writes to an argument that is not an out= argument (in place, or state held
    in the argument); it returns nothing and writes no out= argument (it runs for its
    effect); it makes a tensor from a `str` with no tensor input (a file's name)."""
    schema = op._schema
    args, returns = list(schema.arguments), list(schema.returns)
    if torch.Tag.nondeterministic_seeded in op.tags:
        return "draws on the random number generator: it is tagged nondeterministic_seeded"
    for arg in args:
        if "GeneratorType" in _kinds(arg.type):
            return f"takes a random number generator, '{arg.name}'"
    for what, values in (("argument", args), ("result", returns)):
        for value in values:
            other = next((k for k in _kinds(value.type) if k not in DATA_TYPE_KINDS), None)
            if other is not None:
                named = f" '{value.name}'" if value.name else ""
                return f"the {what}{named} is a {other.removesuffix('Type')}, not tensor data"
    for arg in args:
        if arg.alias_info is not None and arg.alias_info.is_write and not arg.is_out:
            return f"writes to its argument '{arg.name}'"
    if not returns and not any(arg.is_out for arg in args):
        return "returns nothing: it runs only for its effect"
    inputs = [arg for arg in args if not arg.is_out]
    text = next((arg.name for arg in inputs if "StringType" in _kinds(arg.type)), None)
    if text is not None and not any(_holds_tensor(arg.type) for arg in inputs) \
            and any(_holds_tensor(r.type) for r in returns):
        return f"makes a tensor from its string argument '{text}' and no tensor input, as from a file name"
    return None


@lru_cache(maxsize=None)
def op_refusal(name: str) -> str | None:
    """Why a golden alone may not call the operator `name` (`ns::op` or `ns::op.overload`),
    or None when it may: it must be in the `aten` namespace, exist in this torch (what
    cannot be inspected is not run), and be a pure tensor computation (overload_refusal).
    Without an overload torch picks one at call time from the arguments, so every
    overload of the name must be pure."""
    namespace, _, rest = name.partition("::")
    if namespace not in TRUSTED_OP_NAMESPACES:
        return f"namespace '{namespace}' is not ATen's"
    op_name, _, overload = rest.partition(".")
    try:   # the lookup the worker makes: only an operator, never another attribute
        packet = resolve_op(f"aten::{op_name}")
    except OpdiffError:
        return f"torch {torch.__version__} here has no operator aten::{op_name} to inspect"
    names = [overload] if overload else list(packet.overloads())
    for each in names:
        try:
            op = resolve_op(f"aten::{op_name}.{each}")
        except OpdiffError:
            return f"torch {torch.__version__} here has no overload aten::{op_name}.{each} to inspect"
        why = overload_refusal(op)
        if why is not None:
            return why if overload else f"overload '{each}': {why}"
    return None


def refusal(path: str) -> str | None:
    """Why a golden alone may not name `path`, or None when it may. Empty when the path
    is simply outside the allowlist (user code, a class not listed). A TorchCall is data
    like an op: `TorchCall(fn)` is judged by the rule for what it calls (suite/torch_fns.py)."""
    if path.startswith(TORCH_CALL + "(") and path.endswith(")"):
        return fn_refusal(path[len(TORCH_CALL) + 1:-1])
    if "::" in path and not path.startswith("file:"):
        return op_refusal(path)
    return None if path in TORCH_NN_CLASSES or path == TORCH_CALL else ""


def is_trusted(path: str) -> bool:
    return refusal(path) is None


def untrusted_paths(definition: Any) -> list[str]:
    """The paths of `definition` a golden alone may not name, in order, each once; a
    TorchCall whose function is refused as `TorchCall(fn)`."""
    named = [*code_paths(definition), *(f"{TORCH_CALL}({fn})" for fn in definition_fns(definition))]
    return list(dict.fromkeys(p for p in named if not is_trusted(p)))


def described(path: str) -> str:
    """`path`, with the reason a golden alone may not name it where there is one."""
    why = refusal(path)
    return f"{path} ({why})" if why else path
