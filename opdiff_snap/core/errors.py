"""User-facing errors: one clear paragraph each, exit code 2, no traceback unless --debug."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable


class OpdiffError(Exception):
    """A problem with the user's input (suite, flag, store). The CLI prints it and exits 2."""

    exit_code = 2


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says what stays of the run and how to go on. A
    KeyboardInterrupt still, so whatever handles Ctrl-C handles it."""


@dataclass(frozen=True)
class Problem:
    """One validation problem, located as precisely as the input allows."""

    file: str
    message: str
    field: str = ""          # e.g. tests[3].op.vars.bias
    test_id: str = ""
    line: int | None = None  # 1-based, where YAML knows it
    column: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        parts = [where]
        if self.test_id:
            parts.append(f"test '{self.test_id}'")
        if self.field:
            parts.append(self.field)
        return ": ".join(parts) + ": " + self.message


class SuiteError(OpdiffError):
    """Every problem found in one pass over one or more suites."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in suite input:"
        super().__init__("\n".join([head] + [f"  - {p}" for p in self.problems]))


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest choice, or ''."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


MESSAGE_CHARS = 2000
ANSI = re.compile(r"\x1b\[[0-9;]*m")   # terminal colour codes


_BURIED = [  # exporters put the cause under boilerplate; pull it up
    re.compile(r"No ONNX function found for <OpOverload\(op='([^']+)'.*?Failure message: ([^\n]+)", re.S),
    re.compile(r"Unsupported fx node [^,\n]+"),
]


def headline(message: str | None, width: int = 160) -> str:
    """The informative line of an error message, without colour codes."""
    text = ANSI.sub("", message or "")
    for pattern in _BURIED:
        m = pattern.search(text)
        if m:
            return ("no ONNX function for " + ": ".join(m.groups()) if len(m.groups()) > 1
                    else m.group(0))[:width]
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:width]
    return ""


def error_text(exc: BaseException) -> str:
    """`Class: message` without colour codes, trimmed to MESSAGE_CHARS (the head is where
    the cause usually is)."""
    text = ANSI.sub("", str(exc)).strip() or repr(exc)
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " ..."
