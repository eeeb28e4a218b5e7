"""Text that came from a golden, the history or a library, made safe to show.

A test id, a message or a version string may hold characters that act rather than show:
terminal escape sequences (ESC, CSI, OSC), a NUL that XML 1.0 cannot hold even as an
entity, a carriage return that overwrites the line, Unicode bidi overrides and line
separators that make text read differently from what it is, lone surrogates that cannot be
encoded. `printable` writes each of them as a visible escape (`\\x1b`, `\\u202e`), so the
result can go to a terminal, into JUnit XML and (after HTML escaping) into a page. Suites
refuse such characters in test ids outright (`unsafe_char`).

Rich markup (`[bold]`) is a separate matter: text printed through rich goes in as a
`rich.text.Text` or through `rich.markup.escape` (cli/output.py)."""

from __future__ import annotations

import re
from typing import Any

# C0 controls, DEL, C1 controls; bidi marks, embeddings, overrides and isolates; the line and
# paragraph separators; lone surrogates; the two noncharacters XML 1.0 excludes
_OTHERS = ("\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
           "\ud800-\udfff\ufffe\uffff")
UNSAFE = re.compile(f"[\x00-\x1f{_OTHERS}]")
UNSAFE_KEEPING_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")   # tab and newline stay


def _escape(match: re.Match) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: Any, *, lines: bool = False) -> str:
    """`text` (str() of it) with every unsafe character written as a visible escape.
    With `lines`, newlines and tabs stay (a multi-line message keeps its shape); a
    carriage return is escaped either way."""
    s = text if isinstance(text, str) else str(text)
    return (UNSAFE_KEEPING_LINES if lines else UNSAFE).sub(_escape, s)


def unsafe_char(text: str) -> str | None:
    """The first unsafe character of `text` as `U+XXXX`, or None."""
    m = UNSAFE.search(text)
    return f"U+{ord(m.group(0)):04X}" if m else None
