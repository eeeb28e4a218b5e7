"""Text from suites, goldens, expectations files, backends or the history, made safe for the
Markdown it lands in (a check's summary for a CI page, the results page).

Such text may hold what Markdown or the HTML inside it acts on: backticks that close a
code span, `|` that ends a table cell, a newline that ends a row, HTML (`<script>`,
`</details>`), image and link syntax, emphasis. Each function returns one line that shows
the text as it is (controls made visible, as safetext.printable does; runs of whitespace as
one space) and can start or close nothing: `md_text` for running text and table cells,
`md_code` for a code span. Cut to `limit` characters with "…" where given."""

from __future__ import annotations

import re

from .safetext import printable

# the ASCII punctuation that opens or closes inline Markdown or HTML: code spans, emphasis
# and strikethrough, links and images, HTML and autolinks, entities, table cells; `_` only
# where it can delimit emphasis (not between two letters or digits: `torch_cpu_fp32` stays)
_INLINE = re.compile(r"([\\`*\[\]<>|~&]|(?<![^\W_])_|_(?![^\W_]))")
_TICKS = re.compile("`+")


def _line(text: object, limit: int | None) -> str:
    flat = " ".join(printable(text, lines=True).split())
    return flat if limit is None or len(flat) <= limit else flat[:limit - 1] + "…"


def md_text(text: object, limit: int | None = None) -> str:
    """`text` as running Markdown text or a table cell's content: every character that could
    start markup backslash-escaped, so it shows as itself."""
    return _INLINE.sub(r"\\\1", _line(text, limit))


def md_code(text: object, limit: int | None = None, *, cell: bool = False) -> str:
    """`text` as one code span: fenced by more backticks than any run inside it (spaced where
    it starts or ends with one), so nothing inside closes it; HTML inside a code span is shown,
    not run. `cell`: it lands in a table cell, where `|` would end the cell even inside a
    span (GFM reads `\\|` there as `|`). Empty text is an empty string."""
    flat = _line(text, limit)
    if not flat:
        return ""
    fence = "`" * (1 + max((len(m.group()) for m in _TICKS.finditer(flat)), default=0))
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    if cell:
        flat = flat.replace("|", "\\|")
    return f"{fence}{pad}{flat}{pad}{fence}"
