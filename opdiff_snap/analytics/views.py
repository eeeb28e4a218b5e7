"""The DuckDB side of the history store: `runs` and `results` views over store/runs/*.jsonl.

JSONL is the source of truth. `<store>/cache.duckdb` holds the parsed rows and is
brought up to date on every connect from new, grown or changed files only (tracked
by name, size and mtime); deleting it loses nothing. If the cache cannot be opened
for writing (locked by another process, read-only store), everything is read into
memory instead.

Once the tables are up to date the connection gets the `verdicts` table and the verdict_*
macros, made from core/verdicts.py (`register_verdicts`), and is locked (sandbox.lock): user SQL
and the reports see the tables and views, and no file, extension or network. Every
statement then runs under the time and memory limits of `sandbox.Limits`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from ..core.errors import OpdiffError
from ..core.verdicts import TABLE, TABLE_COLUMNS
from ..history.runs import check_store_dir, readable_dir
from . import ingest
from .long_lines import readable_copies
from .sandbox import Limits, check_query, execute, is_interrupt, lock, refusal, stopped_on_interrupt
from .table import Table

CACHE_NAME = "cache.duckdb"
# The cache's layout follows the structure of a result (ingest.READ_COLUMNS, and the columns
# of its table): a field added to results.Result changes it, and the next connect rebuilds
# the cache from the JSONL.
CACHE_VERSION = "4-" + hashlib.sha256((json.dumps(ingest.READ_COLUMNS, sort_keys=True)
                                       + ingest.RESULTS_DDL).encode()).hexdigest()[:16]


class HistoryWarning(UserWarning):
    """A line of history that could not be read (file and line named)."""


@dataclass
class Analytics:
    """An open view of one history store. Use as a context manager."""

    store_dir: Path
    con: duckdb.DuckDBPyConnection
    cached: bool
    warnings: list[str] = field(default_factory=list)
    files_read: int = 0            # history files (re)parsed by this connect
    limits: Limits = field(default_factory=Limits)   # of every statement (sandbox.execute)

    def __enter__(self) -> "Analytics":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def sql(self, sql: str, params: list | None = None) -> Table:
        """Internal queries (trusted SQL) -> Table, under the connection's limits."""
        cols, rows = execute(self.con, sql, params, self.limits)
        return Table(cols, rows)

    def query(self, sql: str) -> Table:
        """Run the user's read-only SQL against the `runs` and `results` views."""
        try:
            with stopped_on_interrupt():
                check_read_only(sql)
                return self.sql(sql)
        except duckdb.Error as e:
            refused = refusal(e)
            if refused is not None:
                raise refused from None
            raise OpdiffError(f"query failed: {e}\nThe views are `runs` and `results` (and the "
                              "`verdicts` table); `opdiff query --schema` lists their columns.") from None

    def schema(self) -> list[tuple[str, str, str, str]]:
        """(view, column, type, meaning) for every column of the views and the verdicts table."""
        from .schema import MEANINGS
        out = []
        for view in ("runs", "results", "verdicts"):
            for name, typ, *_ in self.con.execute(f"DESCRIBE {view}").fetchall():
                out.append((view, name, typ, MEANINGS.get(view, {}).get(name, "")))
        return out


def check_read_only(sql: str) -> None:
    """Reject anything but one statement that only reads the views (see sandbox.check_query)."""
    check_query(sql)


def _history_files(store_dir: Path) -> dict[str, tuple[int, int]]:
    runs = store_dir / "runs"
    out = {}
    if runs.is_dir():
        for p in sorted(runs.glob("*.jsonl")):
            st = p.stat()
            out[str(p.resolve())] = (st.st_size, st.st_mtime_ns)
    return out


def _open_cache(path: Path) -> duckdb.DuckDBPyConnection | None:
    try:
        con = duckdb.connect(str(path))
    except (duckdb.Error, OSError) as exc:
        if is_interrupt(exc):
            raise
        return None
    try:
        con.execute("CREATE TABLE IF NOT EXISTS _cache_meta (key VARCHAR, value VARCHAR)")
        ver = con.execute("SELECT value FROM _cache_meta WHERE key = 'version'").fetchone()
        if ver is None or ver[0] != CACHE_VERSION:   # a cache from another layout: rebuild
            for t in ("_runs", "_results", "_files", "_warnings"):
                con.execute(f"DROP TABLE IF EXISTS {t} CASCADE")
            con.execute("DELETE FROM _cache_meta")
            con.execute("INSERT INTO _cache_meta VALUES ('version', ?)", [CACHE_VERSION])
    except (duckdb.Error, OSError) as exc:
        con.close()
        if is_interrupt(exc):
            raise
        return None
    return con


def _update(con: duckdb.DuckDBPyConnection, files: dict[str, tuple[int, int]]) -> int:
    """Bring the tables up to date with `files`; returns how many files were (re)read."""
    con.execute("SET TimeZone = 'UTC'")
    for ddl in (ingest.TABLES_DDL, ingest.RUNS_DDL, ingest.RESULTS_DDL, ingest.VIEWS_DDL):
        con.execute(ddl)
    known = {f: (s, m) for f, s, m in con.execute("SELECT file, size, mtime_ns FROM _files").fetchall()}
    changed = [f for f, sm in files.items() if known.get(f) != sm]
    gone = [f for f in known if f not in files]
    if not changed and not gone:
        return 0
    con.execute("BEGIN TRANSACTION")
    try:
        drop = changed + gone
        if drop:
            con.execute("CREATE OR REPLACE TEMP TABLE _drop AS SELECT unnest($1::VARCHAR[]) AS file",
                        [drop])
            for t in ("_runs", "_results", "_warnings", "_files"):
                con.execute(f"DELETE FROM {t} WHERE file IN (SELECT file FROM _drop)")
        # a run whose file changed may have rows from another file with the same id: keep those
        if changed:
            _ingest(con, changed, files)
            con.execute("INSERT INTO _files SELECT unnest($1::VARCHAR[]), unnest($2::BIGINT[]), "
                        "unnest($3::BIGINT[])", [changed, [files[f][0] for f in changed],
                                                 [files[f][1] for f in changed]])
        con.execute("COMMIT")
    except BaseException:
        _roll_back(con)
        raise
    con.execute("DROP VIEW IF EXISTS _items")
    for t in ("_raw", "_staged", "_segs", "_bk", "_drop"):
        con.execute(f"DROP TABLE IF EXISTS {t}")
    return len(changed)


def _roll_back(con: duckdb.DuckDBPyConnection) -> None:
    """Undo the load's transaction where one is still open. A Ctrl-C may have ended it
    already (an interrupted COMMIT is rolled back by DuckDB; one that lands just after COMMIT
    finds it committed): the exception that brought us here is what to report, never
    "no transaction is active"."""
    try:
        con.execute("ROLLBACK")
    except (duckdb.Error, RuntimeError):
        pass


def _ingest(con: duckdb.DuckDBPyConnection, changed: list[str], files: dict[str, tuple[int, int]]) -> None:
    """Read `changed` into the tables, 2,000 files at a time; a file holding a line past the
    history's line bound is read through a copy without it (analytics/long_lines.py)."""
    with tempfile.TemporaryDirectory(prefix="opdiff-long-lines-") as folder:
        for i in range(0, len(changed), 2000):
            batch = changed[i:i + 2000]
            copies = readable_copies(batch, {f: files[f][0] for f in batch}, folder)
            read = {o: c for c, o in copies.items()}
            con.execute(ingest.stage_sql([read.get(f, f) for f in batch], copies))
            for sql in (ingest.runs_insert_sql(), ingest.results_insert_sql(), ingest.fix_orphans_sql(),
                        ingest.implausible_sql(), ingest.warnings_insert_sql()):
                con.execute(sql)


_SQL_TYPES = {bool: "BOOLEAN", int: "INTEGER", str: "VARCHAR"}


def _sql_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def register_verdicts(con: duckdb.DuckDBPyConnection) -> None:
    """The `verdicts` table (verdicts.TABLE: one row per verdict) and, for each column but
    `status`, a macro `verdict_<column>(status)`: the value in that status's row; NULL (or
    false for a flag) for a status that is no verdict (opdiff's own files) or NULL."""
    types = [_SQL_TYPES[type(value)] for value in TABLE[0]]
    cols = ", ".join(f"{name} {typ}" for name, typ in zip(TABLE_COLUMNS, types))
    con.execute(f"CREATE OR REPLACE TEMP TABLE verdicts ({cols})")
    con.executemany(f"INSERT INTO verdicts VALUES ({', '.join('?' * len(TABLE_COLUMNS))})",
                    [list(row) for row in TABLE])
    for i, (name, typ) in enumerate(zip(TABLE_COLUMNS, types)):
        if i == 0:
            continue
        cases = " ".join(f"WHEN {_sql_literal(row[0])} THEN {_sql_literal(row[i])}" for row in TABLE)
        otherwise = "false" if typ == "BOOLEAN" else f"NULL::{typ}"
        con.execute(f"CREATE OR REPLACE TEMP MACRO verdict_{name}(status) AS "
                    f"CASE status {cases} ELSE {otherwise} END")


def connect(store_dir: str | os.PathLike, cache: bool = True, warn: bool = True,
            limits: Limits | None = None) -> Analytics:
    """Open the history of `store_dir` (the folder holding `runs/`); every statement on it
    then runs under `limits` (default: Limits()).

    Warnings about unreadable lines are kept in `.warnings` ("file:line: message")
    and, with `warn`, also issued as `HistoryWarning`s. Ctrl-C while the history loads is
    KeyboardInterrupt(sandbox.STOPPED), whatever form DuckDB gave it.
    """
    with stopped_on_interrupt():
        return _connect(store_dir, cache, warn, limits)


def _connect(store_dir: str | os.PathLike, cache: bool, warn: bool, limits: Limits | None) -> Analytics:
    check_store_dir(str(store_dir))
    store = readable_dir(str(store_dir))   # a remote store: its local mirror, synced incrementally
    if not store.is_dir():
        raise OpdiffError(f"history store '{store}' does not exist: run `opdiff check` first, "
                          "or point --store at the folder that holds runs/*.jsonl.")
    files = _history_files(store)
    con = _open_cache(store / CACHE_NAME) if cache else None
    cached = con is not None
    n = 0
    if con is not None:
        try:
            n = _update(con, files)
        except (duckdb.IOException, duckdb.PermissionException, OSError):
            con.close()
            con, cached = None, False
        else:
            # reopen read-only: user SQL then cannot change the cache, whatever it is
            con.close()
            try:
                con = duckdb.connect(str(store / CACHE_NAME), read_only=True)
            except duckdb.Error as exc:
                if is_interrupt(exc):
                    raise
                con, cached = None, False
    if con is None:
        con = duckdb.connect()
        n = _update(con, files)
    con.execute("SET TimeZone = 'UTC'")
    rows = con.execute("SELECT file, line, message FROM _warnings ORDER BY file, line").fetchall()
    register_verdicts(con)
    # everything is loaded: from here on the connection reaches nothing but its tables
    limits = limits or Limits()
    lock(con, limits)
    msgs = [f"{f}:{ln}: {m}" for f, ln, m in rows]
    if warn:
        for m in msgs:
            warnings.warn(m, HistoryWarning, stacklevel=3)
    return Analytics(store, con, cached, msgs, n, limits)
