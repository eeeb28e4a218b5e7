"""The rows of a table a listing command printed (`runs`, `goldens ls`, ...), read without
depending on how the terminal library draws it: any box-drawing character or `|`, or a
run of two or more spaces, separates cells; lines that are only borders are no rows."""

from __future__ import annotations

import re

_SEPARATOR = re.compile(r"[\u2500-\u257f|]|\s{2,}")


def table_rows(text: str) -> list[list[str]]:
    """Each printed line that holds cells, as the list of its cells' texts (the header
    and a title line too: look rows up by a cell's value)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in _SEPARATOR.split(line)]
        cells = [c for c in cells if c]
        if cells:
            rows.append(cells)
    return rows


def row_of(text: str, first_cell: str) -> list[str]:
    """The one row whose first cell is `first_cell`."""
    [row] = [r for r in table_rows(text) if r[0] == first_cell]
    return row
