"""YAML -> plain Python values that remember where they came from.

Mappings load as `YMap` (a dict) and sequences as `YSeq` (a list); both carry the
1-based (line, column) of themselves (`mark`) and of each child value (`marks`),
and `YMap` also of each key (`key_marks`), so validation can point at the exact spot.
Scalars load with YAML 1.1 core types as PyYAML's safe loader resolves them.

Input is bounded before anything big is built: a document over MAX_DOCUMENT_BYTES, one
nested deeper than MAX_DEPTH, or one holding (with every alias expanded) more than
MAX_VALUES values is refused with the position that crossed the line. So a
"billion laughs" alias bomb fails in well under a second, in little memory.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Any, Iterator

import yaml

from ..core.limits import MAX_NESTING
from ..core.regular_files import read_bounded

Mark = tuple[int, int] | None

MAX_DOCUMENT_BYTES = 16 * 2**20
MAX_DEPTH = MAX_NESTING
MAX_VALUES = 1_000_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_constructor = yaml.SafeLoader("")  # only its scalar constructors are used


class YMap(dict):
    """A mapping with positions: `mark`, `marks[key]` (value), `key_marks[key]`."""

    mark: Mark = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.marks: dict[Any, Mark] = {}
        self.key_marks: dict[Any, Mark] = {}


class YSeq(list):
    """A sequence with positions: `mark`, `marks[index]`."""

    mark: Mark = None

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.marks: dict[int, Mark] = {}


class YamlSyntaxError(Exception):
    """A YAML document that does not parse; `problems` holds (message, mark) pairs."""

    def __init__(self, problems: list[tuple[str, Mark]]):
        super().__init__("; ".join(m for m, _ in problems))
        self.problems = problems


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: a suite loads as hundreds of thousands of small
    acyclic objects, and each collection the allocations set off walks every one already
    made (two thirds of the time it takes to parse the shipped OpInfo YAML)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def mark_of(node: yaml.Node) -> Mark:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def child_mark(container: Any, key: Any, default: Mark = None) -> Mark:
    """The position of `container[key]`, else of the container, else `default`."""
    marks = getattr(container, "marks", None)
    if marks is not None and key in marks:
        return marks[key]
    return getattr(container, "mark", None) or default


def key_mark(container: Any, key: Any, default: Mark = None) -> Mark:
    marks = getattr(container, "key_marks", None)
    if marks is not None and key in marks:
        return marks[key]
    return child_mark(container, key, default)


def _scalar(node: yaml.ScalarNode) -> Any:
    ctor = _constructor.yaml_constructors.get(node.tag)
    if ctor is None:
        return node.value
    return ctor(_constructor, node)


def _too_deep(mark: Mark) -> YamlSyntaxError:
    return YamlSyntaxError([(f"nesting deeper than {MAX_DEPTH} levels (a recursive YAML alias?); "
                             "flatten the structure", mark)])


def _too_many(mark: Mark, expanded: bool) -> YamlSyntaxError:
    if expanded:
        why = (" once its aliases are expanded; aliases (*name) repeat everything their anchor "
               "(&name) holds, so nested aliases multiply (an alias bomb?). Write the values out, or "
               "split the suite")
    else:
        why = "; split the suite into several files"
    return YamlSyntaxError([(f"the document holds more than {MAX_VALUES:,} values{why}", mark)])


def _check_events(text: str) -> None:
    """Refuse too deep or too many values while parsing, before composing anything
    (libyaml's composer recurses per level and would crash on very deep input).

    MAX_DEPTH is ours and sits below any parser's own limit, but libyaml scans ahead
    of the events it hands out and may stop at its own nesting limit before we see
    level MAX_DEPTH + 1; the pure-Python parser, which has no such limit, then finds
    where ours was crossed. Any other parse error is left to compose, which reports it
    with its position."""
    try:
        _scan_events(text, _Loader)
    except yaml.YAMLError:
        if _Loader is yaml.SafeLoader:
            return
        try:
            _scan_events(text, yaml.SafeLoader)
        except yaml.YAMLError:
            return


def _scan_events(text: str, loader: Any) -> None:
    depth = values = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep((event.start_mark.line + 1, event.start_mark.column + 1))
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            continue
        elif not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
            continue
        values += 1
        if values > MAX_VALUES:
            raise _too_many((event.start_mark.line + 1, event.start_mark.column + 1), expanded=False)


def _check_expansion(root: yaml.Node) -> None:
    """Count the values `root` holds with every alias expanded (each distinct node is
    counted once and reused), and refuse more than MAX_VALUES."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in busy or depth > MAX_DEPTH:
            raise _too_deep(mark_of(node))
        if isinstance(node, yaml.ScalarNode):
            return 1
        busy.add(key)
        children = (node.value if isinstance(node, yaml.SequenceNode)
                    else [n for pair in node.value for n in pair])
        total = 1
        for child in children:
            total += size(child, depth + 1)
            if total > MAX_VALUES:
                raise _too_many(mark_of(child), expanded=True)
        busy.discard(key)
        sizes[key] = total
        return total

    size(root, 0)


def _convert(node: yaml.Node, duplicates: list[tuple[str, Mark]], depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise _too_deep(mark_of(node))
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node)
    if isinstance(node, yaml.SequenceNode):
        seq = YSeq()
        seq.mark = mark_of(node)
        for i, child in enumerate(node.value):
            seq.append(_convert(child, duplicates, depth + 1))
            seq.marks[i] = mark_of(child)
        return seq
    if isinstance(node, yaml.MappingNode):
        _constructor.flatten_mapping(node)  # resolves `<<` merge keys
        out = YMap()
        out.mark = mark_of(node)
        for key_node, value_node in node.value:
            key = _convert(key_node, duplicates, depth + 1)
            if isinstance(key, (dict, list)):
                raise YamlSyntaxError([("a mapping key must be a plain scalar", mark_of(key_node))])
            if key in out:
                first = (out.key_marks[key] or (0, 0))[0]
                duplicates.append((f"key '{key}' appears twice in one mapping (first at line {first}); remove one",
                                   mark_of(key_node)))
            out[key] = _convert(value_node, duplicates, depth + 1)
            out.marks[key] = mark_of(value_node)
            out.key_marks[key] = mark_of(key_node)
        return out
    raise YamlSyntaxError([(f"unsupported YAML node {type(node).__name__}", mark_of(node))])


def read_yaml_file(path: Path, what: str = "a suite") -> str:
    """The text of a YAML file (`what`: what it is, for the messages): at most
    MAX_DOCUMENT_BYTES of UTF-8. Raises OSError when it cannot be read, YamlSyntaxError
    when it is too big or not UTF-8."""
    return yaml_text(read_yaml_bytes(path), what)


def read_yaml_bytes(path: Path) -> bytes:
    """The bytes of a YAML file, at most one past MAX_DOCUMENT_BYTES (a pipe or a device
    named as a suite is refused before any read). Raises OSError when it cannot be read."""
    return read_bounded(path, MAX_DOCUMENT_BYTES, "suite file", cut=True)


def yaml_text(data: bytes, what: str = "a suite") -> str:
    """A YAML file's bytes as text; raises YamlSyntaxError when they are too many or not
    UTF-8 (`what`: what the file is, "a suite" or "an expectations file", for the messages)."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise YamlSyntaxError([(f"the file is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB, the "
                                f"most {what} may hold; split it into several files", None)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise YamlSyntaxError([(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                                f"{what} must be a UTF-8 YAML file: re-save it as UTF-8, or remove it "
                                f"if it is not {what}", (line, column))]) from None


def load_yaml_text(text: str) -> tuple[Any, list[tuple[str, Mark]]]:
    """Parse one YAML document. Returns (value, duplicate-key problems); raises
    `YamlSyntaxError` when it does not parse or is bigger than the caps allow."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise YamlSyntaxError([(f"the document is larger than {MAX_DOCUMENT_BYTES // 2**20} MiB, "
                                "the most a suite may hold; split it into several files", None)])
    with gc_paused():
        return _load(text)


def _load(text: str) -> tuple[Any, list[tuple[str, Mark]]]:
    _check_events(text)
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = (mark.line + 1, mark.column + 1) if mark is not None else None
        msg = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise YamlSyntaxError([(f"YAML syntax error: {msg}", where)]) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError([(f"YAML syntax error: {exc}", None)]) from None
    if node is None:
        return None, []
    _check_expansion(node)
    duplicates: list[tuple[str, Mark]] = []
    try:
        value = _convert(node, duplicates)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise YamlSyntaxError([(f"YAML value error: {exc.problem}",
                                (mark.line + 1, mark.column + 1) if mark else None)]) from None
    return value, duplicates
