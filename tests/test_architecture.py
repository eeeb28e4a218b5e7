"""docs/architecture.md tells the truth about the package.

The page has a figure of the layers, a table assigning every module to one layer, and the
list of arrows the figure draws. Here: every module the page names exists, every module
of the package is on the page, every arrow is a real import and points down the figure,
no import leaves its layer except along an arrow (or to the lowest layer, which every
layer may import), and neither the arrows nor the modules form a cycle. And the sizes the
code is held to: no module over 500 lines, no function over 80 lines or with more than
12 parameters.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "opdiff_snap"
PAGE = ROOT / "docs" / "architecture.md"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 12


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """Package modules `name` imports, at any depth of its code (lazy imports count)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != name}


FIGURE_LINE = re.compile(r"^ (?P<layer>[a-z]+)\s{2,}(?P<rest>.*)$")
ARROW = "──▶"


def _figure() -> str:
    text = PAGE.read_text()
    match = re.search(r"^## The figure\n.*?```text\n(.*?)```", text, re.S | re.M)
    assert match, "docs/architecture.md has no figure (a ```text block under '## The figure')"
    return match.group(1)


def _parse() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(layer -> module names, layer -> layers its arrow points to), read from the figure.

    A layer line is ` name   modules   ──▶ targets`; the lines below it that start with
    the stack's `│` continue its modules (left of the arrow column) and targets (right)."""
    layers: dict[str, list[str]] = {}
    arrows: dict[str, set[str]] = {}
    layer, column = None, None
    for line in _figure().splitlines():
        match = FIGURE_LINE.match(line)
        if match:
            layer = match.group("layer")
            layers[layer], arrows[layer] = [], set()
            column = line.find(ARROW) if ARROW in line else None
        elif layer is None or not line.strip():
            continue
        left = line[:column] if column is not None else line
        right = line[column + len(ARROW):] if column is not None and len(line) > column else ""
        if match:
            left = match.group("rest") if column is None else line[match.start("rest"):column]
        layers[layer] += re.findall(r"[\w]+\.py|[\w]+/", left)
        arrows[layer] |= {t.strip() for t in right.split(",") if t.strip()}
    assert layers, "the figure has no layers"
    return layers, arrows


def _layers() -> dict[str, list[str]]:
    return _parse()[0]


def _arrows() -> dict[str, set[str]]:
    return _parse()[1]


def _owner() -> dict[str, str]:
    """Module -> its layer."""
    owner = {}
    for layer, names in _layers().items():
        for name in names:
            dotted = ("opdiff_snap." + name.removesuffix("/").removesuffix(".py").replace("/", ".")).removesuffix(
                ".__init__")
            members = [m for m in MODULES if m == dotted or (name.endswith("/") and m.startswith(dotted + "."))]
            assert members, f"docs/architecture.md names `{name}` (layer {layer}); no such module"
            for m in members:
                assert m not in owner, f"{m} is in two layers: {owner[m]} and {layer}"
                owner[m] = layer
    return owner


def _layer_imports() -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> the imports that make that arrow real."""
    owner = _owner()
    edges: dict[tuple[str, str], list[str]] = {}
    for module in MODULES:
        for target in _imports(module):
            a, b = owner[module], owner[target]
            if a != b:
                edges.setdefault((a, b), []).append(f"{module} imports {target}")
    return edges


def test_every_module_is_on_the_page():
    owner = _owner()
    missing = sorted(set(MODULES) - set(owner))
    assert not missing, f"modules not in the Layers table of docs/architecture.md: {missing}"


def test_the_page_names_only_real_modules():
    """The prose under the figure names modules too; each must exist."""
    text = PAGE.read_text()
    prose = text[text.index("What each holds"):text.index("## Contracts")]
    for name in re.findall(r"\*\*([\w/]+(?:\.py)?)\*\*", prose):
        if name.endswith((".py", "/")):
            target = PACKAGE / name
            assert target.exists(), f"docs/architecture.md describes {name}; it does not exist"


def test_every_arrow_is_a_real_import():
    edges = _layer_imports()
    layers = set(_layers())
    for source, targets in _arrows().items():
        assert source in layers, f"arrow from unknown layer {source!r}"
        for target in targets:
            assert target in layers, f"arrow to unknown layer {target!r}"
            assert (source, target) in edges, f"the page draws {source} -> {target}, but nothing there imports it"


def test_every_import_follows_an_arrow():
    arrows = _arrows()
    lowest = list(_layers())[-1]
    stray = [imp for (a, b), imps in _layer_imports().items()
             if b != lowest and b not in arrows.get(a, set()) for imp in imps]
    assert not stray, "imports the page does not draw (an arrow up the flow, or a missing arrow):\n" + "\n".join(stray)


def test_the_arrows_point_down():
    """The layers are a strict order: each arrow goes to a layer below its own in the figure."""
    order = {layer: i for i, layer in enumerate(_layers())}
    upward = [f"{a} -> {b}" for a, targets in _arrows().items() for b in sorted(targets)
              if b in order and order[b] <= order[a]]
    assert not upward, "arrows that do not point down the figure: " + ", ".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt):
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node):
            found = visit(node, [node])
            if found:
                return found
    return None


def test_no_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    for graph, what in ((_arrows(), "layers"), ({m: _imports(m) for m in MODULES}, "modules")):
        found = _cycle(graph)
        assert found is None, f"a cycle of {what}: {' -> '.join(found or [])}"


def test_the_checks_notice_an_upward_import(tmp_path, monkeypatch):
    """A suite module importing the checking layer would be caught."""
    fake = dict(MODULES)
    spy = tmp_path / "spy.py"
    spy.write_text("from ..run.check import check\n")
    fake["opdiff_snap.suite.spy"] = spy
    monkeypatch.setattr(sys.modules[__name__], "MODULES", fake)
    with pytest.raises(AssertionError, match="suite.spy imports opdiff_snap.run.check"):
        test_every_import_follows_an_arrow()


def test_the_checks_notice_an_import_between_run_and_cause(tmp_path, monkeypatch):
    """run/ and cause/ are layers of their own: neither may import the other unless an arrow says so."""
    fake = dict(MODULES)
    spy = tmp_path / "spy.py"
    spy.write_text("from ..cause.localize import localize\n")
    fake["opdiff_snap.run.spy"] = spy
    monkeypatch.setattr(sys.modules[__name__], "MODULES", fake)
    with pytest.raises(AssertionError, match="run.spy imports opdiff_snap.cause.localize"):
        test_every_import_follows_an_arrow()


def test_the_checks_notice_an_arrow_up_the_figure(monkeypatch):
    real = _arrows()
    layers = list(_layers())
    monkeypatch.setattr(sys.modules[__name__], "_arrows", lambda: {**real, layers[-2]: {layers[0]}})
    with pytest.raises(AssertionError, match=f"{layers[-2]} -> {layers[0]}"):
        test_the_arrows_point_down()


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _name(module: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{module}:{fn.lineno} {fn.name}"


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many parameters `fn` takes: *args and **kwargs one each, a leading self or cls none."""
    args = fn.args
    named = [*args.posonlyargs, *args.args]
    own = 1 if named and named[0].arg in ("self", "cls") else 0
    return len(named) - own + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def test_no_module_is_over_500_lines():
    long = [f"{name} ({n} lines)" for name, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_no_function_is_over_80_lines():
    long = [f"{_name(name, fn)} ({n} lines)" for name, path in MODULES.items() for fn in _functions(path)
            if (n := (fn.end_lineno or fn.lineno) - fn.lineno + 1) > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_no_function_takes_more_than_12_parameters():
    wide = [f"{_name(name, fn)} ({n} parameters)" for name, path in MODULES.items() for fn in _functions(path)
            if (n := _parameters(fn)) > MAX_PARAMETERS]
    assert not wide, f"functions with more than {MAX_PARAMETERS} parameters:\n" + "\n".join(wide)


def test_no_file_name_repeats_across_folders():
    """A module is found by its file name: two folders' `cache.py` send a reader to the wrong one."""
    folders: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if path.name != "__init__.py" and "repro_templates" not in path.parts:
            folders.setdefault(path.name, []).append(name)
    repeated = [f"{file}: {', '.join(names)}" for file, names in sorted(folders.items()) if len(names) > 1]
    assert not repeated, "file names used in more than one folder:\n" + "\n".join(repeated)


def test_the_checks_notice_a_repeated_file_name(tmp_path, monkeypatch):
    for folder in ("suite", "goldens"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "cache.py").write_text("x = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {f"opdiff_snap.{folder}.cache": tmp_path / folder / "cache.py"
                                                           for folder in ("suite", "goldens")})
    with pytest.raises(AssertionError, match=r"cache.py: opdiff_snap.suite.cache, opdiff_snap.goldens.cache"):
        test_no_file_name_repeats_across_folders()


def _planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    """Only a module `opdiff_snap.suite.planted` holding `source`, for the size checks to read."""
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {"opdiff_snap.suite.planted": planted})


def test_the_checks_notice_a_long_module(tmp_path, monkeypatch):
    _planted(tmp_path, monkeypatch, "x = 1\n" * (MAX_MODULE_LINES + 1))
    with pytest.raises(AssertionError, match=r"suite.planted \(501 lines\)"):
        test_no_module_is_over_500_lines()
    _planted(tmp_path, monkeypatch, "x = 1\n" * MAX_MODULE_LINES)
    test_no_module_is_over_500_lines()


def test_the_checks_notice_a_long_function(tmp_path, monkeypatch):
    fits = "class A:\n    def short(self):\n" + "        x = 1\n" * (MAX_FUNCTION_LINES - 1)
    _planted(tmp_path, monkeypatch, fits + "\n\ndef long():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    with pytest.raises(AssertionError, match=r"suite.planted:\d+ long \(81 lines\)") as caught:
        test_no_function_is_over_80_lines()
    assert "short" not in str(caught.value)


def test_the_checks_notice_a_function_with_too_many_parameters(tmp_path, monkeypatch):
    _planted(tmp_path, monkeypatch,
             "def wide(a, b, c, d, e, f, g, h, i, j, k, *args, **kwargs):\n    pass\n\n\n"
             "class A:\n    def fits(self, a, b, c, d, e, f, g, h, i, j, k, *, l):\n        pass\n")
    with pytest.raises(AssertionError, match=r"suite.planted:1 wide \(13 parameters\)") as caught:
        test_no_function_takes_more_than_12_parameters()
    assert "fits" not in str(caught.value)


def _described() -> dict[str, set[str]]:
    """Folder -> the module names its part of "What each holds" gives in backticks.

    The prose runs folder by folder: a folder starts at `**name/**` or `` `name/` `` and
    holds the backticked names up to the next folder; `a`/`b` names two modules."""
    text = PAGE.read_text()
    prose = text[text.index("What each holds"):text.index("## Contracts")]
    out: dict[str, set[str]] = {}
    folder = None
    for token in re.finditer(r"\*\*([\w]+)/\*\*|`([\w]+)/`|\*\*[\w.]+\.py\*\*|`([\w/]+)`", prose):
        if token.group(1) or token.group(2):
            folder = token.group(1) or token.group(2)
            out.setdefault(folder, set())
        elif token.group(3) and folder is not None:
            out[folder].update(token.group(3).split("/"))
        else:
            folder = None
    return out


def test_every_module_is_described():
    """Each module of each folder is named, in backticks, in that folder's description."""
    described = _described()
    missing = []
    for path in MODULES.values():
        if path.name in ("__init__.py", "__main__.py") or path.parent == PACKAGE:
            continue
        parts = path.parent.relative_to(PACKAGE).parts
        named = described.get(parts[0], set())
        # a module of a nested package (cause/repro_templates/) is described by that package's name
        if path.stem not in named and not (len(parts) > 1 and parts[1] in named):
            missing.append(f"{parts[0]}/{path.stem}")
    assert not missing, f"modules docs/architecture.md does not describe under their folder: {missing}"
