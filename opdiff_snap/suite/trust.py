"""What a golden's definition may make a worker import when no suite vouches for it.

A golden is data: it travels between machines and buckets, and anyone who can write to
the store can edit its stored definition. When `check` (or `repro`, `localize`,
`goldens reference`) rebuilds a test from a golden alone, the definition may only name

- ATen operators (`aten::...`), which resolve through torch.ops, and
- the documented torch.nn module classes listed below, as the module under test or as a
  constructor argument.

Anything else (a `file:` module, a dotted path into user code or the standard library)
runs only when a suite on disk defines that test identically (its spec hash matches),
or when the user passes `--trust-goldens`, which names what it will import. The list is
explicit, not computed from torch at run time, so a torch upgrade cannot widen it.
"""

from __future__ import annotations

from typing import Any, Iterator

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


def is_trusted(path: str) -> bool:
    if "::" in path and not path.startswith("file:"):
        return path.split("::", 1)[0] in TRUSTED_OP_NAMESPACES
    return path in TORCH_NN_CLASSES


def untrusted_paths(definition: Any) -> list[str]:
    """The paths of `definition` outside the allowlist, in order, each once."""
    return list(dict.fromkeys(p for p in code_paths(definition) if not is_trusted(p)))
