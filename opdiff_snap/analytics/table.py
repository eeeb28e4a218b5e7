"""A plain result table and its renderings: text, csv, json, markdown.

Cells hold what the history holds, which anyone who can write the store may have edited:
every text rendering shows them through `printable` (control characters escaped), and the
JSON one through json's own escaping."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from dataclasses import dataclass
from typing import Any

from ..core.errors import OpdiffError, suggest
from ..core.safetext import printable

FORMATS = ("table", "csv", "json", "markdown")


@dataclass
class Table:
    columns: list[str]
    rows: list[tuple]

    def __len__(self) -> int:
        return len(self.rows)

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]

    def select(self, names: list[str]) -> "Table":
        idx = [self.columns.index(n) for n in names]
        return Table(list(names), [tuple(r[i] for i in idx) for r in self.rows])

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


def cell(v: Any) -> str:
    """One value as text: floats to 4 significant digits, None as empty, control
    characters escaped."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.4g}"
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(cell(x) for x in v) + "]"
    return printable(v)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if hasattr(v, "__float__") and not isinstance(v, (int, float)):   # Decimal
        return float(v)
    return v


def to_text(t: Table) -> str:
    cells = [[cell(v) for v in r] for r in t.rows]
    columns = [printable(c) for c in t.columns]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out) + "\n"


def to_csv(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([printable(c) for c in t.columns])
    for r in t.rows:
        w.writerow([cell(v) if not isinstance(v, float) else repr(v) for v in r])
    return buf.getvalue()


def to_json(t: Table) -> str:
    return json.dumps([{k: _jsonable(v) for k, v in d.items()} for d in t.dicts()], indent=1,
                      ensure_ascii=True) + "\n"


def to_markdown(t: Table) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(esc(printable(c)) for c in t.columns) + " |",
           "|" + "|".join("---" for _ in t.columns) + "|"]
    out += ["| " + " | ".join(esc(cell(v)) for v in r) + " |" for r in t.rows]
    return "\n".join(out) + "\n"


def format_table(t: Table, fmt: str = "table") -> str:
    """Render `t` as one of FORMATS."""
    fn = {"table": to_text, "csv": to_csv, "json": to_json, "markdown": to_markdown}.get(fmt)
    if fn is None:
        raise OpdiffError(f"unknown output format '{fmt}'{suggest(fmt, FORMATS)}; "
                          f"choose one of {', '.join(FORMATS)}.")
    return fn(t)

