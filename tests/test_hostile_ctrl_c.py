"""Ctrl-C on `opdiff query`, at every moment: each interrupt ends with exit 130 and our
message, no traceback, no internal error, nothing on stdout, the history untouched.

The history is made to take a while to load (one check run, copied), the cache removed,
and SIGINT sent at TRIES delays spread from the moment the cache file appears to a little
past the time a query of it takes: while the history is loaded into it (in one transaction: an interrupt landing as that transaction begins, or just after it
commits, once left DuckDB with no transaction to roll back and exit 3), while the
connection is locked, and while a long recursive statement runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.hostile import FAST, assert_clean_failure, make_project, query_interrupted, run_cli, tree_bytes

from opdiff_snap.analytics import views

RECURSIVE = ("WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 1000000000) "
             "SELECT count(*) FROM t, range(1000) r")
TRIES = 12
COPIES = 5


@pytest.fixture(scope="module")
def long_history(tmp_path_factory) -> Path:
    project = make_project(tmp_path_factory.mktemp("ctrl_c") / "p")
    for args in (("record", *FAST), ("check", "-b", "torch_cpu_fp32", *FAST)):
        proc = run_cli(project, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    run = sorted((project / "store" / "runs").glob("*.jsonl"))[-1]
    for i in range(COPIES):
        shutil.copy(run, run.with_name(f"{run.stem}-copy{i:04d}.jsonl"))
    return project


@pytest.mark.slow
def test_every_ctrl_c_of_a_query_is_exit_130_with_our_message(long_history):
    history = tree_bytes(long_history / "store" / "runs")
    *_, loading = query_interrupted(long_history, "SELECT 1", None)   # the load, the lock, a statement
    for i in range(TRIES):
        delay = 1.2 * loading * i / (TRIES - 1)
        code, out, err, _ = query_interrupted(long_history, RECURSIVE, delay, "--memory-limit", "1GiB")
        assert_clean_failure(code, out, err, 130, "opdiff: interrupted; the query was stopped")
        assert out == "", delay
    assert tree_bytes(long_history / "store" / "runs") == history


class _CommitThenInterrupt:
    """A connection whose COMMIT (or BEGIN) succeeds and is followed at once by Ctrl-C, as
    when SIGINT lands while DuckDB runs it: Python raises it right after."""

    def __init__(self, con, after: str):
        self.con, self.after = con, after

    def execute(self, sql, *args):
        out = self.con.execute(sql, *args)
        if sql == self.after:
            raise KeyboardInterrupt
        return out


@pytest.mark.parametrize("after", ["BEGIN TRANSACTION", "COMMIT"])
def test_ctrl_c_right_after_the_load_transaction_begins_or_commits_is_a_stopped_query(long_history, tmp_path,
                                                                                       monkeypatch, after):
    store = tmp_path / "store"
    shutil.copytree(long_history / "store" / "runs", store / "runs")
    update = views._update
    monkeypatch.setattr(views, "_update", lambda con, files: update(_CommitThenInterrupt(con, after), files))
    with pytest.raises(KeyboardInterrupt) as caught:
        views.connect(store)
    assert str(caught.value) == "the query was stopped; nothing was written."
    monkeypatch.setattr(views, "_update", update)
    count = "SELECT count(*), (SELECT count(*) FROM results) FROM runs"
    with views.connect(store, cache=False) as fresh, views.connect(store) as a:   # the cache whole, or rebuilt
        assert a.sql(count).rows == fresh.sql(count).rows
