"""YAML -> plain Python values that remember where they came from.

Mappings load as `YMap` (a dict) and sequences as `YSeq` (a list); both carry the
1-based (line, column) of themselves (`mark`) and of each child value (`marks`),
and `YMap` also of each key (`key_marks`), so validation can point at the exact spot.
Scalars load with YAML 1.1 core types as PyYAML's safe loader resolves them.
"""

from __future__ import annotations

from typing import Any

import yaml

Mark = tuple[int, int] | None

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


def _convert(node: yaml.Node, duplicates: list[tuple[str, Mark]], depth: int = 0) -> Any:
    if depth > 200:
        raise YamlSyntaxError([("nesting too deep (a recursive YAML alias?)", mark_of(node))])
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
                duplicates.append((f"key '{key}' appears twice in one mapping "
                                   f"(first at line {out.key_marks[key][0]}); remove one", mark_of(key_node)))
            out[key] = _convert(value_node, duplicates, depth + 1)
            out.marks[key] = mark_of(value_node)
            out.key_marks[key] = mark_of(key_node)
        return out
    raise YamlSyntaxError([(f"unsupported YAML node {type(node).__name__}", mark_of(node))])


def load_yaml_text(text: str) -> tuple[Any, list[tuple[str, Mark]]]:
    """Parse one YAML document. Returns (value, duplicate-key problems); raises
    `YamlSyntaxError` when it does not parse."""
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
    duplicates: list[tuple[str, Mark]] = []
    try:
        value = _convert(node, duplicates)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise YamlSyntaxError([(f"YAML value error: {exc.problem}",
                                (mark.line + 1, mark.column + 1) if mark else None)]) from None
    return value, duplicates
