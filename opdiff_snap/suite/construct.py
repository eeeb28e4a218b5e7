"""Turn `path`s into Python objects: ATen ops, module classes, constructed modules.

This runs the suite's code, so only workers call it (execution/); the parent process
locates paths without importing them (locate.py).

`file:` paths (canonical: relative to the suite directory, see files.py) are imported
from the file by location under a module name derived from the file's absolute path,
so two suites may both have a `models.py` without clashing. While one is imported, its
own folder and the case's import folders (project root, current directory) are on
sys.path, so a module can import its siblings as `from examples.toy_model import ...`
or `from toy_model import ...`, as under opdiff.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..core.errors import OpdiffError, suggest
from .files import display_path, split_file_path
from .fromconfig import build_from_config
from .locate import not_installed
from .model import Call, Node, TestCase


@contextlib.contextmanager
def importable(dirs: Sequence[Path]):
    """`dirs` at the front of sys.path for the duration; sys.path restored afterwards."""
    added = [str(d) for d in dirs if str(d) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for d in added:
            if d in sys.path:
                sys.path.remove(d)


def load_file_module(file: Path, import_dirs: Sequence[Path] = ()):
    file = file.resolve()
    mod_name = "opdiff_user_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    mod = sys.modules.get(mod_name)
    if mod is not None:
        return mod
    if not file.is_file():
        raise OpdiffError(f"{file}: file not found. Fix the `file:` path; it is relative to the suite file.")
    spec = importlib.util.spec_from_file_location(mod_name, file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    try:
        with importable((file.parent, *import_dirs)):
            spec.loader.exec_module(mod)
    except Exception as exc:
        del sys.modules[mod_name]
        raise OpdiffError(f"{file}: importing it failed with {type(exc).__name__}: {exc}") from exc
    return mod


def import_path(path: str, suite_dir: Path, import_dirs: Sequence[Path] = ()) -> Any:
    """Resolve a dotted import path or a `file:` path to the object it names."""
    if path.startswith("file:"):
        file, name = split_file_path(path)
        mod = load_file_module(suite_dir / file, import_dirs)
        try:
            return getattr(mod, name)
        except AttributeError:
            names = [n for n in vars(mod) if not n.startswith("_")]
            raise OpdiffError(f"{suite_dir / file}: has no '{name}'{suggest(name, names)}.") from None
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise OpdiffError(f"'{path}' is not a dotted import path like torch.nn.Linear.")
    try:
        mod = importlib.import_module(module_name)
    except ImportError:
        # e.g. torch.nn.functional.relu: walk attributes from the longest importable prefix
        head, _, rest = module_name.partition(".")
        try:
            obj: Any = importlib.import_module(head)
            for part in (rest.split(".") if rest else []):
                obj = getattr(obj, part)
            mod = obj
        except (ImportError, AttributeError):
            if importlib.util.find_spec(head) is None:
                raise OpdiffError(not_installed(path, module_name) + ".") from None
            raise OpdiffError(f"'{path}': cannot import module '{module_name}'.") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        names = [n for n in dir(mod) if not n.startswith("_")]
        raise OpdiffError(f"'{path}': '{module_name}' has no '{attr}'{suggest(attr, names)}.") from None


def resolve_op(name: str):
    """`aten::add.Tensor` -> torch.ops.aten.add.Tensor; without overload, the packet."""
    ns, sep, rest = name.partition("::")
    if not sep or not rest:
        raise OpdiffError(f"op '{name}' is not of the form aten::name[.overload].")
    op_name, _, overload = rest.partition(".")
    try:   # only operators: an attribute of the namespace object (`aten::__setattr__`) is not one
        packet = getattr(getattr(torch.ops, ns), op_name) if op_name.isidentifier() else None
    except (AttributeError, RuntimeError):
        packet = None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        raise OpdiffError(f"op '{name}': torch has no operator {ns}::{op_name}.")
    if not overload:
        return packet
    try:
        op = getattr(packet, overload) if overload.isidentifier() else None
    except (AttributeError, RuntimeError):
        op = None
    if not isinstance(op, torch._ops.OpOverload):
        raise OpdiffError(f"op '{name}': {ns}::{op_name} has no overload '{overload}'"
                          f"{suggest(overload, packet.overloads())}.")
    return op


def build_value(node: Node, suite_dir: Path, sample: Callable[[Node], Any] | None = None,
                import_dirs: Sequence[Path] = ()) -> Any:
    """A constructor argument from its node: literals as they are, `construct` nodes
    built recursively, sampling nodes through `sample` (inputs-only nodes otherwise)."""
    kind = node.get("type")
    if kind == "const":
        return node["value"]
    if kind == "int_list":
        return list(node["elems"])
    if kind == "tuple":
        return tuple(build_value(e, suite_dir, sample, import_dirs) for e in node["elems"])
    if kind in ("construct", "module"):
        cls = _builder(node["path"], suite_dir, import_dirs, module=False)
        args = [build_value(a, suite_dir, sample, import_dirs) for a in node.get("args", [])]
        kwargs = {k: build_value(v, suite_dir, sample, import_dirs) for k, v in node.get("kwargs", {}).items()}
        if node.get("config") is not None:
            return build_from_config(cls, node["path"], node["config"], args, kwargs)
        return cls(*args, **kwargs)
    if sample is None:
        raise OpdiffError(f"a '{kind}' node cannot be used as a constructor argument here.")
    return sample(node)


def _builder(path: str, suite_dir: Path, import_dirs: Sequence[Path], module: bool) -> Any:
    """The class or function `path` names, refused before it is called when it is
    neither (a builtin such as os.system) or, for a module, a class that is no nn.Module."""
    from .locate import Located, kind_of, problem

    obj = import_path(path, suite_dir, import_dirs)
    why = problem(Located(kind_of(obj)), path, module)
    if why is not None:
        raise OpdiffError(why + ".")
    return obj


def construct_module(call: Call, suite_dir: Path, sample: Callable[[Node], Any] | None = None,
                     import_dirs: Sequence[Path] = (), where: str = "") -> torch.nn.Module:
    """The module `call` builds, in eval mode; `where` (the suite file and test) leads the
    message of a config the class refuses."""
    cls = _builder(call.target, suite_dir, import_dirs, module=True)
    args = [build_value(a, suite_dir, sample, import_dirs) for a in call.args]
    kwargs = {k: build_value(v, suite_dir, sample, import_dirs) for k, v in call.kwargs.items()}
    try:
        if call.config is not None:
            module = build_from_config(cls, call.target, call.config, args, kwargs)
        else:
            module = cls(*args, **kwargs)
    except OpdiffError as exc:
        raise OpdiffError(f"{where}: {exc}" if where else str(exc)) from exc
    except Exception as exc:
        raise OpdiffError(f"constructing {call.target}(...) failed with {type(exc).__name__}: {exc}. "
                          f"Check the test's {'config, ' if call.config is not None else ''}args and "
                          "kwargs.") from exc
    if not isinstance(module, torch.nn.Module):
        raise OpdiffError(f"{call.target} built a {type(module).__name__}, not a torch.nn.Module.")
    return module.eval()


def build_modules(case: TestCase, sample: Callable[[Node], Any] | None = None) -> dict[str, torch.nn.Module]:
    """The module(s) of a case by side: {} for op tests, {"a": m} or {"a": m, "b": m2}."""
    sides: Mapping[str, Call | None] = {"a": case.call, "b": case.pair}
    return {side: construct_module(call, case.suite_dir, sample, case.import_dirs, where_of(case))
            for side, call in sides.items() if call is not None and call.kind == "module"}


def where_of(case: TestCase) -> str:
    return f"{display_path(case.suite)}: test '{case.id}'"


def bind(case: TestCase, invocation) -> dict[str, Any]:
    """What each side of a case calls, with the stored weights loaded: the ATen op, or the
    module (eval mode) with `invocation.states[side]`. Keys "a" (and "b" for pairs)."""
    modules = build_modules(case)
    sides: dict[str, Any] = {}
    for side, call in (("a", case.call), ("b", case.pair)):
        if call is None:
            continue
        if call.kind == "op":
            sides[side] = resolve_op(call.target)
            continue
        state = invocation.states.get(side)
        if state is None:
            raise OpdiffError(f"test '{case.id}': the stored invocation has no module state for side "
                              f"'{side}' ({call.target}). Re-record the golden.")
        try:
            modules[side].load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise OpdiffError(f"test '{case.id}': the stored weights do not fit the module built from "
                              f"{call.target} ({' '.join(str(exc).split()).rstrip('.')}). The module "
                              "changed since the golden was recorded: re-record it.") from exc
        sides[side] = modules[side].eval()
    return sides


def call_inputs(case: TestCase, invocation) -> tuple[list[Any], dict[str, Any]]:
    """Detached deep copies of the stored args and kwargs (callers may mutate or cast them),
    input 0 rebuilt as complex when the test travels it as a real [..., 2] tensor."""
    import copy

    def detached(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach()
        if isinstance(x, (list, tuple)):
            return type(x)(detached(v) for v in x)
        if isinstance(x, dict):
            return {k: detached(v) for k, v in x.items()}
        return x

    args = detached(copy.deepcopy(list(invocation.args)))
    kwargs = detached(copy.deepcopy(dict(invocation.kwargs)))
    if case.cast_input0_to_complex and args and isinstance(args[0], torch.Tensor) \
            and not args[0].is_complex():
        if args[0].shape[-1:] != (2,):
            raise OpdiffError(f"test '{case.id}': cast_input0_to_complex needs input 0 as a real "
                              f"tensor of shape [..., 2]; it has shape {list(args[0].shape)}.")
        args[0] = torch.view_as_complex(args[0].contiguous())
    return args, kwargs
