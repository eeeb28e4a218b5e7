"""What user SQL may do: read the history views, nothing else.

Two layers. `check_query` reads the statement before it runs: one read-only statement,
table functions from an allow-list only (never one that reads files), no file paths
as table names, PRAGMAs that only describe the database. `lock` then closes the
connection itself once the history is loaded: DuckDB's external access is switched off
(no file, network or extension access; DuckDB still lets a connection read its own
database file, which is the history's cache) and the configuration locked, so a
statement cannot switch it back on. `refusal` turns what DuckDB refuses into the same
kind of message as the first layer.

Limits bound what a statement may cost: `lock` sets the connection's memory limit before
it locks the configuration, and `execute` runs each statement in a helper thread while
this one waits, so that the time limit and Ctrl-C both reach DuckDB (`interrupt()`); a
statement DuckDB runs in the calling thread would hold off Python's signal handling
until it ends.
"""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import duckdb

from ..core.config import Settings, memory_text, usable_memory
from ..core.errors import OpdiffError

SCOPE = "query can only read the `runs` and `results` views"
READ_ONLY_TYPES = {"SELECT", "PRAGMA", "EXPLAIN"}

# table functions that compute or describe, never touch a file
ALLOWED_TABLE_FUNCTIONS = {"range", "generate_series", "unnest", "json_each", "json_tree", "repeat",
                           "repeat_row", "summary", "histogram", "histogram_values", "pg_timezone_names",
                           "icu_calendar_names"}
ALLOWED_TABLE_PREFIXES = ("duckdb_", "pragma_")
# known to read or write files
FILE_FUNCTIONS = re.compile(r"^(read_\w+|\w+_scan|glob|sniff_csv|parquet_\w+|iceberg_\w+|delta_\w+|"
                            r"import_database|copy_database|\w+_external_resource\w*|which_secret)$")
# run SQL held in a string, which this check cannot see
SQL_FUNCTIONS = {"query", "query_table", "json_execute_serialized_sql"}
STATEMENT_REASONS = {
    "ATTACH": "opens another database file", "DETACH": "closes a database",
    "COPY": "reads or writes files", "EXPORT": "writes files", "LOAD": "installs or loads extensions",
    "SET": "changes settings", "VARIABLE_SET": "changes settings", "CALL": "runs a function as a statement",
}
ALLOWED_PRAGMAS = {"version", "platform", "database_size", "database_list", "show_databases",
                   "show_tables", "show_tables_expanded", "table_info", "show", "functions",
                   "collations", "user_agent", "storage_info", "metadata_info"}
_PATH_LIKE = re.compile(r"[/\\.:~]")

_parser: duckdb.DuckDBPyConnection | None = None


def _parse_tree(sql: str) -> dict[str, Any]:
    """DuckDB's own parse of one SELECT statement, as JSON (parsing runs nothing)."""
    global _parser
    if _parser is None:
        _parser = duckdb.connect()
        lock(_parser)
    row = _parser.execute("SELECT json_serialize_sql($1)", [sql]).fetchone()
    assert row is not None
    return json.loads(row[0])


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            yield x
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def _strip_comments(sql: str) -> str:
    return re.sub(r"^\s*(--[^\n]*(\n|$)\s*|/\*.*?\*/\s*)*", "", sql, flags=re.S)


def _kind(stmt) -> str:
    return str(stmt.type).rsplit(".", 1)[-1]


def check_query(sql: str) -> None:
    """Raise OpdiffError unless `sql` is one statement that only reads the database:
    SELECT/WITH/FROM/DESCRIBE/SHOW/SUMMARIZE/EXPLAIN over it, or a describing PRAGMA."""
    try:
        stmts = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise OpdiffError(f"cannot parse the query: {e}") from None
    if len(stmts) != 1:
        raise OpdiffError(f"give exactly one SQL statement to query (got {len(stmts)}).")
    kind = _kind(stmts[0])
    text = _strip_comments(sql)
    m = re.match(r"explain\s+(analyze\s+)?", text, flags=re.I)
    if kind == "EXPLAIN" and m:
        # EXPLAIN binds its statement (reading any file it names); ANALYZE also runs it
        text = text[m.end():]
        inner = duckdb.extract_statements(text)
        kind = _kind(inner[0]) if inner else kind
        kind = "SELECT" if kind == "EXPLAIN" else kind
    if kind not in READ_ONLY_TYPES:
        why = f" ({STATEMENT_REASONS[kind]})" if kind in STATEMENT_REASONS else ""
        raise OpdiffError(
            f"query is read-only: a {kind} statement{why} is not allowed. Use SELECT, WITH, "
            "DESCRIBE, SHOW, SUMMARIZE, PRAGMA or EXPLAIN over the `runs` and `results` views.")
    if kind == "PRAGMA":
        _check_pragma(text)
    else:
        _check_select(text)


def _check_pragma(text: str) -> None:
    m = re.match(r"pragma\s+(\w+)\s*(=|\(|$|;)", text, flags=re.I)
    name = m.group(1).lower() if m else "?"
    if m and m.group(2) == "=":
        raise OpdiffError(f"{SCOPE}; PRAGMA {name} = ... changes a setting and is not allowed.")
    if name not in ALLOWED_PRAGMAS:
        what = ("reads files outside the history" if FILE_FUNCTIONS.match(name)
                else "runs SQL held in a string" if name in SQL_FUNCTIONS
                else "does more than describe the database")
        raise OpdiffError(f"{SCOPE}; PRAGMA {name} {what} and is not allowed. PRAGMAs that "
                          f"describe it are: {', '.join(sorted(ALLOWED_PRAGMAS))}.")


def _check_select(text: str) -> None:
    tree = _parse_tree(text)
    if tree.get("error"):
        raise OpdiffError(f"cannot check the query: {tree.get('error_message')}. "
                          "Write one SELECT over the `runs` and `results` views.")
    for node in _nodes(tree):
        typ = node.get("type")
        if typ == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            name = str(fn.get("function_name", "?")).lower()
            if name in ALLOWED_TABLE_FUNCTIONS or name.startswith(ALLOWED_TABLE_PREFIXES):
                continue
            if FILE_FUNCTIONS.match(name):
                raise OpdiffError(f"{SCOPE}; {name} reads files outside the history and is not allowed.")
            if name in SQL_FUNCTIONS:
                raise OpdiffError(f"{SCOPE}; {name} runs SQL held in a string, which cannot be "
                                  "checked, and is not allowed. Write the query itself instead.")
            raise OpdiffError(f"{SCOPE}; the table function {name} is not allowed. Allowed: "
                              f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}, duckdb_*(), pragma_*().")
        if typ in ("BASE_TABLE", "SHOW_REF"):
            table = str(node.get("table_name") or "")
            if table and _PATH_LIKE.search(table):
                raise OpdiffError(f"{SCOPE}; '{table}' names a file outside the history, and files "
                                  "cannot be read. Use the view names `runs` and `results`.")


@dataclass(frozen=True)
class Limits:
    """What one statement over the history may cost: `timeout_s` seconds, and at most
    `memory` bytes for the connection (None: half of this machine's memory)."""

    timeout_s: float = Settings.query_timeout_s
    memory: int | None = None

    @classmethod
    def of(cls, settings: Settings) -> "Limits":
        return cls(settings.query_timeout_s, settings.query_memory_limit)

    def memory_bytes(self) -> int:
        return self.memory if self.memory is not None else default_memory()


def default_memory() -> int:
    """Half of the memory this process may use (core.config.usable_memory)."""
    return max(2**28, usable_memory() // 2)


def execute(con: duckdb.DuckDBPyConnection, sql: str, params: list | None,
            limits: Limits) -> tuple[list[str], list[tuple]]:
    """(column names, rows) of one statement, run under `limits`.

    The statement runs in a helper thread; this thread waits for it and interrupts it
    when its time is up (OpdiffError naming the limit) or on Ctrl-C (KeyboardInterrupt,
    once DuckDB has stopped). Running out of memory is an OpdiffError naming the limit;
    any other DuckDB error is raised as it is."""
    box: dict[str, Any] = {}
    done = threading.Event()   # not Thread.join: a join that Ctrl-C interrupts can leave
                               # is_alive() False while the thread runs on (Python < 3.13)

    def run() -> None:
        try:
            rel = con.execute(sql, params or [])
            cols = [d[0] for d in rel.description] if rel.description else []
            box["result"] = (cols, [tuple(r) for r in rel.fetchall()])
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    deadline = time.monotonic() + limits.timeout_s
    worker = threading.Thread(target=run, name="opdiff-sql", daemon=True)
    worker.start()
    try:
        while not done.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                _stop(con, done, worker)
                raise OpdiffError(
                    f"a query over the history was stopped after {limits.timeout_s:g} s, its time limit "
                    "(--timeout-s of `opdiff query`, the reports and diff-runs, or query-timeout-s in "
                    "[tool.opdiff]); nothing was written. Narrow the query (a WHERE, a LIMIT, fewer "
                    f"joins) or give it more time, e.g. --timeout-s {limits.timeout_s * 4:g}.")
            done.wait(min(left, 0.2))
    except KeyboardInterrupt:
        _stop(con, done, worker)
        raise KeyboardInterrupt(STOPPED) from None
    _ended(worker)
    error = box.get("error")
    if isinstance(error, duckdb.OutOfMemoryException):
        limit = memory_text(limits.memory_bytes())
        raise OpdiffError(
            f"a query over the history needed more memory than its limit of {limit} (--memory-limit of "
            "`opdiff query`, the reports and diff-runs, or query-memory-limit in [tool.opdiff]) and was "
            "stopped; nothing was written. Narrow the query (a WHERE, a LIMIT, aggregate before "
            "sorting) or give it more memory, e.g. --memory-limit "
            f"{memory_text(2 * limits.memory_bytes())}.") from None
    if error is not None:
        raise error
    return box["result"]


STOPPED = "the query was stopped; nothing was written."


def is_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C in any of the forms it reaches us: a KeyboardInterrupt,
    DuckDB's InterruptException, or the RuntimeError("Query interrupted") its Python client
    raises in place of the KeyboardInterrupt when the signal lands while it works on the
    calling thread (loading the history, parsing a statement)."""
    if isinstance(exc, (KeyboardInterrupt, duckdb.InterruptException)):
        return True
    return isinstance(exc, RuntimeError) and "interrupted" in str(exc).lower()


@contextmanager
def stopped_on_interrupt() -> Iterator[None]:
    """Turn every form of Ctrl-C inside the block into KeyboardInterrupt(STOPPED)."""
    try:
        yield
    except BaseException as exc:
        if is_interrupt(exc) and not (isinstance(exc, KeyboardInterrupt) and str(exc) == STOPPED):
            raise KeyboardInterrupt(STOPPED) from None
        raise


def _ended(worker: threading.Thread) -> None:
    """Wait (briefly: its statement has ended) for the statement's thread to be gone, so that
    no thread of ours is still in DuckDB's client when the interpreter exits after a Ctrl-C
    (Python < 3.13 ends a thread that is still there at exit wherever it is, in C++ code
    too, which can abort the process after our message was printed)."""
    try:
        worker.join(5.0)
    except KeyboardInterrupt:
        pass   # a second Ctrl-C: the statement is stopped already


def _stop(con: duckdb.DuckDBPyConnection, done: threading.Event, worker: threading.Thread) -> None:
    """Interrupt the running statement until it has ended (DuckDB checks for an interrupt
    between chunks of work; one that comes before the statement began is lost, hence the
    repeats), and its thread with it."""
    while not done.is_set():
        con.interrupt()
        done.wait(0.05)
    _ended(worker)


def lock(con: duckdb.DuckDBPyConnection, limits: Limits | None = None) -> None:
    """Switch off everything beyond the data already in `con`, set its memory limit
    (`limits`, default: Limits()) and lock its settings.

    Call it after the history is loaded into tables: from here on nothing can be
    read from or written to a file, an extension or the network, whatever the SQL. A
    history read through an fsspec filesystem registered with DuckDB (a remote store)
    is locked the same way: that read happens during loading, before this call, and
    the query only sees the tables."""
    # no spill files: in-memory connections would put them under ./.tmp, outside the store
    con.execute("SET temp_directory = ''")
    con.execute("SET python_enable_replacements = false")   # no Python variables as tables
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute(f"SET memory_limit = '{(limits or Limits()).memory_bytes()}B'")
    con.execute("SET lock_configuration = true")


def refusal(exc: duckdb.Error) -> OpdiffError | None:
    """A clear error for what the locked connection refused; None for other errors."""
    msg = str(exc)
    if isinstance(exc, duckdb.PermissionException) or "disabled by configuration" in msg:
        m = re.search(r'access (?:file|directory) "([^"]*)"', msg)
        what = f"'{m.group(1)}'" if m else "a file"
        return OpdiffError(f"{SCOPE}; the query tried to reach {what} outside the history, which "
                           "is not allowed.")
    if "configuration has been locked" in msg:
        return OpdiffError(f"{SCOPE}; it cannot change settings.")
    if "exists in the" in msg and "extension" in msg:
        return OpdiffError(f"{SCOPE}; extensions cannot be installed or loaded in a query.")
    return None
