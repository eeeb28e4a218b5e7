"""The views: incremental cache, read-only queries, opdiff's own files, schema, the verdicts table."""

from __future__ import annotations

import json
import os

import pytest
from helpers.history.synth import Res, Run, write_run

from opdiff_snap.analytics import check_read_only, connect
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import FAILING, NOT_RUN, PASSING, PRECEDENCE, TABLE, Verdict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _run(store, rid, day, status="PASS"):
    return write_run(store, Run(rid, f"2026-02-0{day}T00:00:00Z",
                                [Res("add", "onnx_cpu_fp32", status=status),
                                 Res("add", "torch_cpu_fp32")]))


QUERY = "SELECT run_id, test_id, preset, status FROM results ORDER BY ALL"


def test_cache_is_incremental_and_disposable(tmp_path):
    _run(tmp_path, "a", 1)
    with connect(tmp_path) as an:
        assert an.cached and an.files_read == 1
        first = an.query(QUERY)
    assert (tmp_path / "cache.duckdb").is_file()
    with connect(tmp_path) as an:                     # nothing new: nothing re-read
        assert an.files_read == 0 and an.query(QUERY) == first
    _run(tmp_path, "b", 2, status="MISMATCH")        # a new run file: only it is read
    with connect(tmp_path) as an:
        assert an.files_read == 1
        assert an.query("SELECT count(*) FROM runs").rows == [(2,)]
    # a grown file (a resumed run appending) is re-read, its old rows replaced
    line = Res("mul", "onnx_cpu_fp32").line("a", "torch_cpu_fp32", "2026-02-01T00:00:01Z")
    with open(tmp_path / "runs" / "a.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    with connect(tmp_path) as an:
        assert an.files_read == 1
        after = an.query(QUERY)
    assert len(after) == 5 and ("a", "mul", "onnx_cpu_fp32", "PASS") in after.rows
    os.remove(tmp_path / "runs" / "b.jsonl")           # a removed file leaves the views
    with connect(tmp_path) as an:
        assert an.query("SELECT DISTINCT run_id FROM results").rows == [("a",)]
        kept = an.query(QUERY)
    os.remove(tmp_path / "cache.duckdb")              # deleting the cache loses nothing
    with connect(tmp_path) as an:
        assert an.files_read == 1 and an.query(QUERY) == kept


def test_unwritable_cache_falls_back_to_memory(tmp_path):
    _run(tmp_path, "a", 1)
    (tmp_path / "cache.duckdb").mkdir()               # cannot be opened as a database
    with connect(tmp_path) as an:
        assert not an.cached
        assert an.query("SELECT count(*) FROM results").rows == [(2,)]


def test_cache_locked_by_another_process_falls_back(tmp_path):
    import subprocess
    import sys
    _run(tmp_path, "a", 1)
    with connect(tmp_path):
        pass
    holder = subprocess.Popen([sys.executable, "-c",
                               "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('ok', flush=True); time.sleep(30)",
                               str(tmp_path / "cache.duckdb")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        _run(tmp_path, "b", 2)
        with connect(tmp_path) as an:
            assert not an.cached
            assert an.query("SELECT count(*) FROM runs").rows == [(2,)]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("sql", [
    "SELECT 1", "WITH x AS (SELECT 1) SELECT * FROM x", "DESCRIBE results", "SHOW TABLES",
    "SUMMARIZE results", "PRAGMA version", "EXPLAIN SELECT * FROM runs", "FROM runs",
    "-- a comment\nSELECT 2"])
def test_read_only_allows(sql):
    check_read_only(sql)


@pytest.mark.parametrize("sql", [
    "DELETE FROM results", "DROP VIEW runs", "CREATE TABLE t AS SELECT 1",
    "INSERT INTO _results SELECT * FROM _results", "COPY results TO '/tmp/x.csv'",
    "ATTACH '/tmp/x.db'", "SET threads = 1", "SELECT 1; DROP VIEW runs",
    "EXPLAIN ANALYZE DELETE FROM results", "UPDATE _runs SET host = 'x'"])
def test_read_only_rejects(sql):
    with pytest.raises(OpdiffError, match="read-only|exactly one"):
        check_read_only(sql)


def test_query_rejects_writes_and_reports_sql_errors(tmp_path):
    _run(tmp_path, "a", 1)
    with connect(tmp_path) as an:
        with pytest.raises(OpdiffError, match="DELETE statement is not allowed"):
            an.query("DELETE FROM results")
        with pytest.raises(OpdiffError) as failed:   # DuckDB's own words sit between our two parts
            an.query("SELECT nope FROM results")
        text = str(failed.value)
        assert text.startswith("query failed: ") and "`opdiff query --schema` lists their columns" in text
        assert an.query("SELECT count(*) FROM results").rows == [(2,)]


def test_verdicts_table_is_made_from_the_enum(tmp_path):
    """User SQL reads the same vocabulary as the code: one row per Verdict, in precedence
    order, and the macros agree with the groups (a new verdict cannot be missing there)."""
    _run(tmp_path, "a", 1)
    for cache in (True, False):          # the read-only cache and an in-memory connection alike
        with connect(tmp_path, cache=cache) as an:
            t = an.query("SELECT * FROM verdicts ORDER BY rank")
            assert t.columns == ["status", "rank", "kind", "passing", "failing", "not_run"]
            assert t.rows == list(TABLE)
            assert [r[0] for r in t.rows] == [v.value for v in PRECEDENCE]
            assert {r[0] for r in t.rows} == {v.value for v in Verdict}
            macros = an.query("SELECT status, verdict_rank(status), verdict_kind(status), "
                              "verdict_passing(status), verdict_failing(status), verdict_not_run(status) "
                              "FROM verdicts ORDER BY rank")
            assert macros.rows == t.rows
            grouped = {v.value: (v in PASSING, v in FAILING, v in NOT_RUN) for v in Verdict}
            assert {r[0]: r[3:] for r in t.rows} == grouped
            # a status that is no verdict (opdiff's own files), or none at all
            assert an.query("SELECT verdict_rank('OK'), verdict_kind('OK'), verdict_passing('OK'), "
                            "verdict_failing(NULL), verdict_not_run(NULL)").rows == [(None, None, False, False, False)]
            assert an.query("SELECT v.kind, count(*) FROM results JOIN verdicts v USING (status) "
                            "GROUP BY ALL").rows == [("passing", 2)]


def test_schema_lists_both_views_with_meanings(tmp_path):
    _run(tmp_path, "a", 1)
    with connect(tmp_path) as an:
        rows = an.schema()
    cols = {(v, c): (t, m) for v, c, t, m in rows}
    assert cols[("runs", "onnxruntime")][0] == "VARCHAR"
    assert cols[("runs", "started")][0] == "TIMESTAMP"
    assert cols[("results", "infer_ms_all")][0] == "DOUBLE[]"
    assert cols[("verdicts", "rank")][0] == "INTEGER" and cols[("verdicts", "not_run")][0] == "BOOLEAN"
    assert all(m for _, _, _, m in rows), [c for v, c, t, m in rows if not m]


def test_opdiff_own_lines_are_read(tmp_path):
    """opdiff's files: meta nested under "meta", results under backends[].res lists,
    the baseline as an object, several runs appended to one file."""
    runs = tmp_path / "runs"
    runs.mkdir()
    meta = lambda ts, ort: {"type": "meta", "meta": {
        "format_name": "opdiff_run", "created_at": ts,
        "env": {"python": "3.11.7 (main, Dec 2023)", "torch": "2.5.0", "onnxruntime": ort}}}
    item = {"type": "item", "id": "mul_x", "test_type": "op", "cases": [{"op": "aten::mul"}],
            "baseline": {"backend": "torch_cpu_fp32", "status": "OK", "ms": 1.0},
            "backends": [
                {"backend": "onnx_cpu_fp32", "res": [{"status": "OK", "ms": 0.5},
                                                     {"status": "OK", "ms": 0.7}],
                 "times_all": None, "diff_all": [{"ok": True, "max_abs": 2e-6}]},
                {"backend": "coreml_cpu_fp16", "res": [{"status": "EXPORT_FAIL", "ms": None}],
                 "times_all": None, "diff_all": None}]}
    lines = [meta("2025-12-01T10:00:00+00:00", "1.20.0"), item,
             meta("2025-12-02T10:00:00+00:00", "1.21.0"), item]
    (runs / "opdiff_demo.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with connect(tmp_path) as an:
        assert an.warnings == []
        assert an.query("SELECT run_id, started, complete, python, onnxruntime FROM runs "
                        "ORDER BY started").rows[0][2:] == (False, "3.11.7", "1.20.0")
        assert [r[0] for r in an.query("SELECT run_id FROM runs ORDER BY started").rows] == \
            ["opdiff_demo", "opdiff_demo#2"]
        t = an.query("SELECT run_id, test_id, preset, baseline, status, infer_ms, max_abs, line "
                     "FROM results WHERE run_id = 'opdiff_demo' ORDER BY preset")
    assert t.rows == [
        ("opdiff_demo", "mul_x", "coreml_cpu_fp16", "torch_cpu_fp32", "EXPORT_FAIL", None, None, 2),
        ("opdiff_demo", "mul_x", "onnx_cpu_fp32", "torch_cpu_fp32", "OK", 0.6, 2e-6, 2),
        ("opdiff_demo", "mul_x", "torch_cpu_fp32", "torch_cpu_fp32", "OK", 1.0, None, 2)]


def test_missing_store(tmp_path):
    with pytest.raises(OpdiffError, match="does not exist"):
        connect(tmp_path / "nope")


def test_empty_store_answers(tmp_path):
    with connect(tmp_path) as an:
        assert an.query("SELECT count(*) FROM results").rows == [(0,)]



LOADING_INTERRUPTED = """
import os, signal, sys, threading, time
from opdiff_snap.analytics import connect, views

def slow(con, *args, **kwargs):   # loading that takes long enough for the user to give up
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:   # short statements: never longer than this, interrupted or not
        con.execute("SELECT count(*) FROM range(3000000) a, range(300) b").fetchall()

views._update = slow
try:
    connect(sys.argv[1])
except KeyboardInterrupt as exc:
    print("KeyboardInterrupt:", exc)
except BaseException as exc:
    print(type(exc).__name__ + ":", exc)
"""


def test_ctrl_c_while_the_history_loads_is_a_stopped_query(tmp_path):
    """A real Ctrl-C while DuckDB loads the history on the main thread reaches us as DuckDB's
    RuntimeError, not as a KeyboardInterrupt: it still says the query was stopped, so the
    command exits 130 with our message. (A fresh interpreter: signals reach only the main
    thread, and the loading must be the first DuckDB work of the process.)"""
    import subprocess
    import sys

    _run(tmp_path, "a", 1)
    proc = subprocess.run([sys.executable, "-c", LOADING_INTERRUPTED, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.strip() == "KeyboardInterrupt: the query was stopped; nothing was written.", \
        proc.stdout + proc.stderr[-2000:]


def test_duckdb_s_own_interrupt_while_the_history_loads_is_a_stopped_query(tmp_path, monkeypatch):
    """The same for DuckDB's InterruptException (its connection interrupted from elsewhere)."""
    import threading
    import time

    from opdiff_snap.analytics import views

    _run(tmp_path, "a", 1)

    def slow(con, *args, **kwargs):
        stop = threading.Event()

        def interrupt():
            while not stop.wait(0.05):
                con.interrupt()

        threading.Thread(target=interrupt, daemon=True).start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                con.execute("SELECT count(*) FROM range(3000000) a, range(300) b").fetchall()
        finally:
            stop.set()

    monkeypatch.setattr(views, "_update", slow)
    with pytest.raises(KeyboardInterrupt) as caught:
        connect(tmp_path)
    assert str(caught.value) == "the query was stopped; nothing was written."
