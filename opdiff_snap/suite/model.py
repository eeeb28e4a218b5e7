"""What a suite expands to: concrete test cases, one seeded realisation of one, and the
gradients recorded for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping

if TYPE_CHECKING:
    import torch

Node = Mapping[str, Any]  # a validated node with refs, dims and vars resolved (plain JSON)


@dataclass(frozen=True)
class Tolerance:
    """Any field may be None: it then falls back to the precision's default.
    `baseline_factor`: how many times the baseline's own measured rounding error a
    target may differ by (0 turns that allowance off). `precision_factor`: how many times
    torch eager's own error at the target's precision a composite output on fp16/bf16 may
    reach (0 turns that allowance off). `steps` and `min_sqnr`: see compare/int8_errors.py."""

    atol: float | None = None
    rtol: float | None = None
    baseline_factor: float | None = None
    precision_factor: float | None = None
    # int8 presets: the lowering error allowed, in quantization steps of each output, and
    # the smallest SQNR (dB) of the quantized model against the golden (None: not a verdict)
    steps: float | None = None
    min_sqnr: float | None = None


@dataclass(frozen=True)
class Call:
    """What a test calls: an ATen op, or a module constructed from `path` with args/kwargs.

    `path` is a dotted import path or `file:relative/file.py::Name` (canonical form:
    relative to the suite's directory, whatever folder the suite author wrote it from).
    Constructor args are nodes: `const`, `construct`, ... nodes resolved but not sampled.
    `config`: plain settings; the module is then `cls(cls.config_class(**config), *args,
    **kwargs)` (suite/fromconfig.py).
    """

    kind: Literal["op", "module"]
    target: str
    args: tuple[Node, ...] = ()
    kwargs: Mapping[str, Node] = field(default_factory=dict)
    impl: str | None = None
    config: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class TestCase:
    """One expanded, concrete test with a stable id."""

    __test__ = False  # not a pytest class

    id: str
    suite: Path                      # the file that defined it (after includes)
    call: Call                       # side a for pair tests
    inputs: tuple[Node, ...]         # positional input nodes
    kwargs: Mapping[str, Node]       # keyword input nodes
    pair: Call | None = None         # side b of a template_compare_pair
    device: str = "cpu"
    impl: str | None = None
    out: Node | None = None
    cast_input0_to_complex: bool = False
    # our extensions
    tolerance: Mapping[str, Tolerance] = field(default_factory=dict)  # key: "*", "fp16", preset name
    seeds: tuple[int, ...] = (0,)
    tags: tuple[str, ...] = ()
    skip: Mapping[str, str] = field(default_factory=dict)            # preset-or-glob -> reason
    grad: bool = False
    profile: str = "normal"          # the input profile of its floating inputs (suite/profiles.py)
    # identity
    definition: Mapping[str, Any] = field(default_factory=dict)      # canonical expanded JSON
    spec_hash: str = ""
    source_files: tuple[Path, ...] = ()                               # file: modules used
    import_dirs: tuple[Path, ...] = ()   # on sys.path while its file: modules import (not hashed)

    @property
    def dynamic(self) -> Mapping[str, Any] | None:
        """A sized test's dynamic dims (suite/dynamic.py): {"dims": {symbol: sizes}, "at":
        {symbol: its size here}}; None for every other test."""
        d = self.definition.get("dynamic")
        return d if isinstance(d, Mapping) else None

    @property
    def test_type(self) -> str:
        if self.pair is not None:
            return "pair"
        return self.call.kind

    @property
    def suite_dir(self) -> Path:
        return self.suite.parent

    def code_paths(self) -> list[tuple[str, bool, Mapping[str, Any] | None]]:
        """(path, names a module, its config or None) for every dotted or `file:` path the
        test constructs: its module(s), and `module` / `construct` nodes in their arguments."""
        out: list[tuple[str, bool, Mapping[str, Any] | None]] = []

        def walk(node: Any) -> None:
            if isinstance(node, Mapping):
                if node.get("type") in ("module", "construct") and isinstance(node.get("path"), str):
                    out.append((node["path"], node["type"] == "module", node.get("config")))
                for key, value in node.items():
                    if key != "config":   # plain settings, never nodes
                        walk(value)
            elif isinstance(node, (list, tuple)):
                for value in node:
                    walk(value)

        for call in (self.call, self.pair):
            if call is not None and call.kind == "module":
                out.append((call.target, True, call.config))
                walk(list(call.args))
                walk(dict(call.kwargs))
        return out


@dataclass
class Invocation:
    """Everything needed to call a test once: inputs exactly as handed to the op,
    and the parameters and buffers of its module(s) by side ("a", and "b" for pairs).
    """

    args: list[Any]
    kwargs: dict[str, Any]
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


@dataclass
class RecordedGrads:
    """The gradients recorded for a `grad: true` test on the baseline (`Golden.grads`):
    `cotangent`, one entry per output tensor leaf (a float32 tensor for a float output,
    None otherwise), and `grads`, the gradient of sum(out * cotangent) with respect to
    each float input and parameter: {"inputs": {"args[0]": g}, "params": {"fc.weight": g}}
    (execution/gradients.py)."""

    cotangent: list[torch.Tensor | None]
    grads: dict[str, dict[str, torch.Tensor]]

    def to_nested(self) -> dict[str, Any]:
        """The one nested value a golden stores: {"cotangent": [...], "grads": {...}}."""
        return {"cotangent": list(self.cotangent), "grads": self.grads}

    @classmethod
    def from_nested(cls, value: Any) -> "RecordedGrads":
        """The inverse of to_nested; raises TypeError for a value it did not make."""
        if not (isinstance(value, dict) and isinstance(value.get("cotangent"), list)
                and isinstance(value.get("grads"), dict)):
            raise TypeError("grads must be an object with a 'cotangent' list and a 'grads' object")
        return cls(list(value["cotangent"]), value["grads"])
