"""What a `path` names, found without running the user's code.

Validation must not import `file:` modules or user packages: a module that exits,
crashes or hangs at import would take the parent process with it, and a suite is read by
many commands (list-tests, validate, record, check). So paths are located statically:

- `torch...` paths are resolved by importing torch's own modules (the tool runs torch);
- a module that this process has already imported (the standard library we use, say) is
  looked up with getattr, which runs nothing new;
- anything else is found on disk (`importlib.util.find_spec` of the top-level package
  only, which runs nothing, then the package folders) and the file is parsed with `ast`
  for a top-level class, function, assignment or import of that name.

A package whose `__init__` replaces itself in sys.modules by a `_LazyModule` (the
convention of transformers and other Hugging Face packages) exports, on first access, the
names its modules list in `__all__` and those its `if TYPE_CHECKING:` block imports; those
are found the same way, by reading the files (see `lazy_exports`).

A name defined in a way parsing cannot settle (an assignment, a star import, a module
`__getattr__`) is UNKNOWN: the worker that builds the test imports it, and
`opdiff validate --imports` asks a worker to import every such path.
"""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import importlib.util
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import suggest
from .reads import note


class Kind(str, enum.Enum):
    MODULE_CLASS = "an nn.Module subclass"
    CLASS = "a class"                 # not known to be an nn.Module subclass
    PLAIN_CLASS = "a class that is not an nn.Module subclass"
    FUNCTION = "a function"
    BUILTIN = "a builtin"             # a C function or other non-Python callable
    VALUE = "a value that is not callable"
    UNKNOWN = "unknown without importing it"


@dataclass(frozen=True)
class Located:
    kind: Kind
    where: str = ""                   # file:line, when found on disk


class NotFound(Exception):
    """The path names nothing that exists; the message says what is missing."""


EXTRAS = {"transformers": "zoo"}   # packages an extra of ours installs


def not_installed(path: str, module_name: str) -> str:
    """Why `path` cannot be found when its package is missing, with the extra that brings it."""
    top = module_name.split(".")[0]
    if top in EXTRAS:
        return (f"'{path}': {top} is not installed in this environment; install the extra that brings it: "
                f"pip install 'opdiff-snap[{EXTRAS[top]}]'")
    return (f"'{path}': cannot find module '{module_name}' (not installed, or not on the import path of "
            "this environment)")


def problem(located: Located, path: str, module: bool) -> str | None:
    """Why `path` cannot be a module (module=True) or a construct path, or None."""
    at = f" ({located.where})" if located.where else ""
    if located.kind in (Kind.VALUE, Kind.BUILTIN):
        return (f"'{path}' names {located.kind.value}{at}; a path must name a class or a function "
                "that builds the object")
    if module and located.kind is Kind.PLAIN_CLASS:
        return (f"'{path}' names {located.kind.value}{at}; a module path must name an nn.Module "
                "subclass or a function that returns a module")
    return None


# ---------------------------------------------------------------- in this process

def _resolve_loaded(path: str, trusted_import: bool) -> Located | None:
    """Resolve through modules already imported (or torch's, importable); None when the
    module is neither."""
    module_name, _, attr = path.rpartition(".")
    parts = module_name.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        mod = sys.modules.get(name)
        if mod is None and trusted_import:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
        if mod is None:
            continue
        obj = mod
        for part in parts[i:] + [attr]:
            # a module is asked only for what it holds: a lazy module's getattr imports
            if not (part in vars(obj) if isinstance(obj, types.ModuleType) and not trusted_import
                    else hasattr(obj, part)):
                if not trusted_import:
                    return None   # perhaps a submodule not imported yet: look on disk
                names = [n for n in dir(obj) if not n.startswith("_")]
                raise NotFound(f"'{path}': '{getattr(obj, '__name__', name)}' has no '{part}'{suggest(part, names)}")
            obj = getattr(obj, part)
        return Located(kind_of(obj))
    return None


def kind_of(obj: object) -> Kind:
    import inspect

    import torch

    if isinstance(obj, type):
        return Kind.MODULE_CLASS if issubclass(obj, torch.nn.Module) else Kind.PLAIN_CLASS
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return Kind.FUNCTION
    if callable(obj):
        return Kind.BUILTIN
    return Kind.VALUE


# ---------------------------------------------------------------- on disk

def package_files(module_name: str) -> list[Path]:
    """Candidate source files of a dotted module, found without importing anything."""
    top, _, rest = module_name.partition(".")
    note("spec", top)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if not rest:
        return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []
    out = []
    for root in spec.submodule_search_locations or []:
        base = Path(root).joinpath(*rest.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            note("probe", os.path.abspath(candidate))
            if candidate.is_file():
                out.append(candidate)
    return out


def _bases_say_plain(node: ast.ClassDef) -> bool:
    """True when the class visibly derives from nothing but `object`."""
    return all(isinstance(b, ast.Name) and b.id == "object" for b in node.bases) and not node.keywords


def locate_in_file(file: Path, name: str, display: str, depth: int = 0) -> Located:
    """Find top-level `name` in a Python file by parsing it."""
    note("read", os.path.abspath(file))
    try:
        source = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise NotFound(f"{display}: not UTF-8 text, cannot be a Python module") from None
    except OSError as exc:
        raise NotFound(f"{display}: cannot read it ({exc.strerror or exc})") from None
    try:
        tree = ast.parse(source, filename=str(file))
    except SyntaxError as exc:
        raise NotFound(f"{display}:{exc.lineno}: syntax error: {exc.msg}") from None
    star = False
    found: Located | None = None
    lazy = file.name == "__init__.py" and builds_lazy_module(tree)
    body = tree.body + (type_checking_block(tree) if lazy else [])
    for node in body:  # the last top-level binding wins, as at run time
        at = f"{display}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ClassDef) and node.name == name:
            found = Located(Kind.PLAIN_CLASS if _bases_say_plain(node) else Kind.CLASS, at)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = Located(Kind.FUNCTION, at)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found = Located(Kind.UNKNOWN, at)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    # a lazy package's own modules (a relative import) are all in lazy_exports
                    star = star or not (lazy and isinstance(node, ast.ImportFrom) and node.level > 0)
                elif (alias.asname or alias.name.split(".")[0]) == name:
                    found = _follow(node, alias, file, at, depth)
    if found is not None:
        return found
    if lazy:
        note("walk", os.path.abspath(file.parent))
        exports = lazy_exports(str(file.parent))
        if name in exports:
            target = file.parent / exports[name]
            return locate_in_file(target, name, str(target), depth + 1)
        if name in _string_constants(tree):   # named in an import structure parsing does not follow
            return Located(Kind.UNKNOWN, display)
        if not star:
            raise NotFound(f"{display}: this lazily loaded package exports no '{name}'{suggest(name, exports)}")
    if star:
        return Located(Kind.UNKNOWN, display)
    if any(isinstance(n, (ast.FunctionDef,)) and n.name == "__getattr__" for n in tree.body):
        return Located(Kind.UNKNOWN, display)
    names = [n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
    raise NotFound(f"{display}: has no '{name}'{suggest(name, names)}")


def builds_lazy_module(tree: ast.Module) -> bool:
    """Whether a package's `__init__` puts a `_LazyModule` in its place in sys.modules."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called == "_LazyModule" and any(
                    isinstance(t, ast.Subscript) and ast.unparse(t.value) == "sys.modules" for t in node.targets):
                return True
    return False


def type_checking_block(tree: ast.Module) -> list[ast.stmt]:
    """The statements of the top-level `if TYPE_CHECKING:` blocks: what a lazy package
    declares it exports."""
    return [stmt for node in tree.body if isinstance(node, ast.If)
            and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING") for stmt in node.body]


def _string_constants(tree: ast.Module) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


_ALL = re.compile(r"^__all__\s*=\s*(\[.*?\]|\(.*?\))", re.S | re.M)


@functools.lru_cache(maxsize=8)
def lazy_exports(package_dir: str) -> dict[str, str]:
    """{name: file relative to `package_dir`} for every name a module below it lists in
    `__all__`, the first file in sorted order winning; `convert_*` and `modular_*` files are
    not part of a lazy package's interface, as transformers' import structure has it. Read,
    never imported."""
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py") or name == "__init__.py" or name.startswith(("convert_", "modular_")):
                continue
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            if b"__all__" not in data:
                continue
            m = _ALL.search(data.decode("utf-8", "replace"))
            try:
                names = ast.literal_eval(m.group(1)) if m else ()
            except (ValueError, SyntaxError):
                continue
            rel = os.path.relpath(path, package_dir)
            for n in names:
                if isinstance(n, str):
                    out.setdefault(n, rel)
    return out


def _follow(node: ast.stmt, alias: ast.alias, file: Path, at: str, depth: int) -> Located:
    """Where an imported name comes from: a sibling file followed a few levels, torch and
    loaded modules resolved, anything else UNKNOWN."""
    if depth > 4 or not isinstance(node, ast.ImportFrom):
        return Located(Kind.UNKNOWN, at)
    if node.level:
        base = file.parent
        for _ in range(node.level - 1):
            base = base.parent
        target = base.joinpath(*(node.module or "").split(".")) if node.module else base
        for candidate in (target.with_suffix(".py"), target / "__init__.py"):
            note("probe", os.path.abspath(candidate))
            if candidate.is_file():
                try:
                    return locate_in_file(candidate, alias.name, str(candidate), depth + 1)
                except NotFound:
                    return Located(Kind.UNKNOWN, at)
        return Located(Kind.UNKNOWN, at)
    try:
        return locate_dotted(f"{node.module}.{alias.name}", depth + 1)
    except NotFound:
        return Located(Kind.UNKNOWN, at)


def locate_dotted(path: str, depth: int = 0) -> Located:
    """What a dotted import path names (see the module docstring)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise NotFound(f"'{path}' is not a dotted import path like torch.nn.Linear")
    loaded = _resolve_loaded(path, trusted_import=module_name.split(".")[0] == "torch")
    if loaded is not None:
        return loaded
    files = package_files(module_name)
    if not files:
        # maybe the last parts are attributes of a class in a shorter module path
        head, _, _ = module_name.rpartition(".")
        if head and package_files(head):
            return Located(Kind.UNKNOWN, head)
        raise NotFound(not_installed(path, module_name))
    return locate_in_file(files[0], attr, str(files[0]), depth)


def locate_path(path: str, suite_dir: Path) -> Located:
    """A canonical `file:` path (relative to `suite_dir`) or a dotted one."""
    if path.startswith("file:"):
        from .files import split_file_path

        rel, name = split_file_path(path)
        return locate_in_file(suite_dir / rel, name, rel)
    return locate_dotted(path)
