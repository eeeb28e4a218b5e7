"""Which functions a `TorchCall` test may call: torch's own operator functions and Tensor
methods, nothing else.

A TorchCall's `fn` is a path such as `torch.add`, `torch.nn.functional.conv2d`,
`torch.linalg.norm`, `torch.ops.aten.add.Tensor` or `Tensor.add_`. It is judged twice:

- by its text (`fn_refusal`, no torch needed), when a suite is validated and when a
  golden alone names it: the namespace must be one of torch's operator namespaces
  (`FUNCTION_NAMESPACES`, `torch.ops.aten`, `Tensor`), the name must not be one of
  torch's loaders, savers, file readers, setters of global state or namespaces of
  other things (`torch.save`, `torch.load`, `torch.from_file`, `torch.hub`, ...), and a
  Tensor method must be public or an operator (`Tensor.__radd__`, never
  `Tensor.__reduce_ex__`);
- by what it resolves to (`object_refusal`), in the worker before the call: a builtin
  bound from torch's C operator tables that names an ATen operator, a Python function of
  torch's functional modules, an ATen OpOverload or packet, or a Tensor method. A module
  torch happens to import (`torch.os`) is never walked into: names are looked up on the
  namespace's own module object only.
"""

from __future__ import annotations

import re
from typing import Any

TORCH_CALL = "opdiff_snap.suite.torch_call.TorchCall"

# namespaces whose functions are operators (the path before the last dot)
FUNCTION_NAMESPACES = ("torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special",
                       "torch.masked", "torch.signal.windows", "torch.nested", "torch.sparse")
# modules torch's Python operator functions are defined in (their __module__)
FUNCTION_MODULES = frozenset({"torch.nn.functional", "torch.functional", "torch.masked._ops",
                              "torch.signal.windows.windows", "torch.nested", "torch.sparse",
                              "torch._refs", "torch._decomp.decompositions"})
# modules the C operator bindings report (their __module__)
BUILTIN_MODULES = frozenset({"torch", "torch._C._VariableFunctions", "torch._C._nn", "torch._C._linalg",
                             "torch._C._fft", "torch._C._special", "torch._C._nested", "torch._C._sparse"})
# ATen operators that reach outside the tensors: a file, the terminal
OUTSIDE_OPS = frozenset({"from_file", "_print", "save", "load"})
# names directly under torch that are not operators: loaders, savers, file readers, global state,
# namespaces of other things (compilers, hubs, extension builders, packaging)
NOT_OPERATORS = frozenset({
    "save", "load", "from_file", "hub", "jit", "onnx", "export", "compile", "compiler", "package", "utils",
    "distributed", "multiprocessing", "library", "classes", "backends", "cuda", "mps", "xpu", "mtia", "cpu",
    "serialization", "storage", "random", "manual_seed", "seed", "initial_seed", "get_rng_state",
    "use_deterministic_algorithms", "import_ir_module", "import_ir_module_from_buffer", "autograd",
    "fx", "testing", "profiler", "overrides", "futures", "monitor", "func", "vmap", "cond", "typename",
    "is_tensor", "is_storage", "load_library",
})
TENSOR_NOT_OPERATORS = frozenset({
    "share_memory_", "pin_memory", "apply_", "map_", "map2_", "register_hook",
    "register_post_accumulate_grad_hook", "backward", "storage", "untyped_storage", "numpy", "tolist",
    "module_load", "data_ptr", "record_stream",
})
# dunder methods that are operators (a + b, a[i], ...)
OPERATOR_DUNDERS = frozenset(f"__{n}__" for n in """
    add radd iadd sub rsub isub mul rmul imul matmul rmatmul imatmul truediv rtruediv itruediv div rdiv
    idiv floordiv rfloordiv ifloordiv mod rmod imod pow rpow ipow neg pos abs invert and rand iand or ror
    ior xor rxor ixor lshift rlshift ilshift rshift rrshift irshift eq ne lt le gt ge getitem
""".split())
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXAMPLES = "torch.add, torch.nn.functional.relu, torch.linalg.norm, torch.ops.aten.add.Tensor, Tensor.add_"


def fn_refusal(fn: Any) -> str | None:
    """Why a TorchCall may not call `fn`, judged by its text; None when it may."""
    if not isinstance(fn, str) or not fn:
        return f"fn must be a dotted path such as {EXAMPLES}; got {fn!r}"
    parts = fn.split(".")
    if not all(_NAME.match(p) for p in parts):
        return f"fn {fn!r} is not a dotted path of names"
    if parts[0] == "Tensor":
        if len(parts) != 2:
            return f"fn {fn!r}: a Tensor method is written Tensor.<method>"
        name = parts[1]
        if name.startswith("_") and name not in OPERATOR_DUNDERS:
            return f"Tensor.{name} is not an operator method (only public methods and operators such as __radd__)"
        if name in TENSOR_NOT_OPERATORS:
            return f"Tensor.{name} is not a tensor computation"
        return None
    if parts[:3] == ["torch", "ops", "aten"]:
        if len(parts) not in (4, 5):
            return f"fn {fn!r}: an ATen operator is written torch.ops.aten.<op>[.<overload>]"
        return f"aten::{parts[3]} reaches outside the tensors" if parts[3] in OUTSIDE_OPS else None
    namespace, name = ".".join(parts[:-1]), parts[-1]
    if namespace not in FUNCTION_NAMESPACES:
        return (f"'{namespace}' is not one of torch's operator namespaces ({', '.join(FUNCTION_NAMESPACES)}, "
                "torch.ops.aten, Tensor)")
    if (namespace == "torch" and name in NOT_OPERATORS) or name.startswith("set_") or name in OUTSIDE_OPS:
        return f"{fn} is not an operator function (a loader, saver, file reader, setting or namespace)"
    return None


def object_refusal(fn: str, obj: Any) -> str | None:
    """Why the object `fn` resolved to may not be called; None when it may (see the module
    docstring). Needs torch."""
    import types

    import torch

    if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        # a packet takes unknown attributes for overload names: its namespace is in its name
        namespace = obj.namespace if isinstance(obj, torch._ops.OpOverload) else \
            obj._qualified_op_name.partition("::")[0]
        return None if namespace == "aten" else f"{fn} is not an ATen operator"
    if fn.startswith("Tensor."):
        kinds = (types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                 types.BuiltinFunctionType)
        return None if isinstance(obj, kinds) else f"{fn} is a {type(obj).__name__}, not a method"
    if isinstance(obj, types.BuiltinFunctionType):
        module = getattr(obj, "__module__", None)
        if module not in BUILTIN_MODULES:
            return f"{fn} is a builtin of {module}, not of torch's operator tables"
        name = obj.__name__
        if name in OUTSIDE_OPS or not hasattr(torch.ops.aten, name):
            return f"{fn} is a builtin of torch that is not an ATen operator, or reaches outside the tensors"
        return None
    if isinstance(obj, types.FunctionType):
        module = obj.__module__ or ""
        return None if module in FUNCTION_MODULES else f"{fn} is a Python function of {module}, not an operator"
    return f"{fn} is a {type(obj).__name__}, not a function"


def definition_fns(definition: Any) -> list[str]:
    """The `fn` of every TorchCall a stored definition builds, in order (non-strings as
    their text, so that they are refused by name)."""
    found: list[str] = []
    if isinstance(definition, dict):
        target = definition.get("target") if definition.get("kind") == "module" else definition.get("path")
        if target == TORCH_CALL:
            kwargs, args = definition.get("kwargs"), definition.get("args")
            kwargs = kwargs if isinstance(kwargs, dict) else {}
            args = args if isinstance(args, list) else []
            node = kwargs.get("fn", args[0] if args else None)
            value = node.get("value") if isinstance(node, dict) else node
            found.append(value if isinstance(value, str) else repr(value))
        for value in definition.values():
            found += definition_fns(value)
    elif isinstance(definition, list):
        for value in definition:
            found += definition_fns(value)
    return found
