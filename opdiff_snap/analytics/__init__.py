"""History analytics: DuckDB views over store/runs/*.jsonl, reports, plots, HTML."""

from .sandbox import Limits
from .table import FORMATS, Table, format_table
from .views import Analytics, HistoryWarning, check_read_only, connect

__all__ = ["Analytics", "FORMATS", "HistoryWarning", "Limits", "Table", "check_read_only", "connect",
           "format_table"]
