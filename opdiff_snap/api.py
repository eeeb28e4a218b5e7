"""The public Python API. Each CLI command calls one of these.

    suites --load/select--> cases --materialize--> Invocation --baseline--> Golden   (record)
    goldens --read--> Golden --target--> Outcome --compare--> Result --> history     (check)
    store/*.jsonl --DuckDB--> tables                                                 (query)
"""

from __future__ import annotations

from pathlib import Path

from .checking import check
from .recording import record
from .results import Result, RunReport

__all__ = ["Result", "RunReport", "check", "query", "record"]


def query(sql: str, store: Path = Path("store")):
    """Read-only SQL over the run history; returns an analytics Table (columns, rows)."""
    from .analytics import connect

    with connect(store, warn=False) as a:
        return a.query(sql)
