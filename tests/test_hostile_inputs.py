"""Hostile and broken inputs: every one ends in a clear error (exit 2, or the command's
own verdict exit code), no traceback, nothing outside the store folders changed, and
nothing already recorded lost.

Covered: SQL that tries to leave the history (files, extensions, settings, other
databases), YAML that is too big, too deep, an alias bomb or not UTF-8, paths of the
wrong kind, read-only stores, a full disk, and goldens edited by hand (verify and check
agree on them). Numbers in flags and settings: test_hostile_numbers.py; control characters
in ids and text: test_hostile_text.py; `upgrade --with`: test_hostile_requirements.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from helpers.cli import PY, invoke
from helpers.hostile import (
    FAST,
    REPO,
    assert_clean_failure,
    can_drop_dac,
    copy_project,
    edit_attrs,
    env,
    golden_meta,
    make_project,
    query_interrupted,
    run_cli,
    snapshot,
    tree_bytes,
)

from opdiff_snap.analytics import connect


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A project with goldens of add, relu, scale (a file: module) and big, one record
    run and one check run, made by the real CLI."""
    project = make_project(tmp_path_factory.mktemp("recorded") / "p")
    for args in (("record", *FAST), ("check", "-b", "torch_cpu_fp32", *FAST)):
        proc = run_cli(project, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return project


@pytest.fixture
def project(recorded, tmp_path) -> Path:
    return copy_project(recorded, tmp_path / "p")


def run_ids(project: Path, command: str | None = None) -> list[str]:
    """The runs in the history store (of one command), by name."""
    out = []
    for p in sorted((project / "store" / "runs").glob("*.jsonl")):
        if command is None or json.loads(p.read_text().splitlines()[0])["command"] == command:
            out.append(p.stem)
    return out


def test_subprocesses_run_this_checkout(tmp_path):
    proc = subprocess.run([PY, "-c", "import opdiff_snap; print(opdiff_snap.__file__)"], cwd=tmp_path,
                          capture_output=True, text=True, env=env())
    assert Path(proc.stdout.strip()).resolve().is_relative_to(REPO)


# ---------------------------------------------------------------- the query sandbox

SANDBOX = [
    ("SELECT * FROM read_csv('/etc/passwd')", "read_csv reads files outside the history"),
    ("SELECT * FROM read_csv('{p}/secret.csv')", "read_csv reads files outside the history"),
    ("SELECT * FROM read_text('/etc/passwd')", "read_text reads files outside the history"),
    ("SELECT * FROM glob('/etc/*')", "glob reads files outside the history"),
    ("SELECT * FROM read_json('{p}/secret.json')", "read_json reads files outside the history"),
    ("SELECT * FROM read_parquet('{p}/secret.parquet')", "read_parquet reads files outside the history"),
    ("SELECT * FROM read_blob('store/cache.duckdb')", "read_blob reads files outside the history"),
    ("SELECT * FROM runs, LATERAL read_text(runs.file)", "read_text reads files outside the history"),
    ("EXPLAIN SELECT * FROM read_csv('/etc/passwd')", "read_csv reads files outside the history"),
    ("SUMMARIZE SELECT * FROM read_csv('{p}/secret.csv')", "read_csv reads files outside the history"),
    ("FROM '{p}/secret.csv'", "names a file outside the history"),
    ("DESCRIBE '{p}/secret.csv'", "names a file outside the history"),
    ("SELECT * FROM query('SELECT * FROM read_text(''/etc/passwd'')')", "runs SQL held in a string"),
    ("PRAGMA import_database('{p}/imp')", "PRAGMA import_database reads files outside the history"),
    ("PRAGMA enable_profiling", "PRAGMA enable_profiling does more than describe the database"),
    ("ATTACH '{p}/other.db' AS other", "a ATTACH statement (opens another database file) is not allowed"),
    ("COPY results TO '{p}/pwned.csv'", "a COPY statement (reads or writes files) is not allowed"),
    ("EXPORT DATABASE '{p}/exported'", "a EXPORT statement (writes files) is not allowed"),
    ("INSTALL httpfs", "installs or loads extensions"),
    ("LOAD json", "installs or loads extensions"),
    ("SET enable_external_access = true", "a SET statement (changes settings) is not allowed"),
    ("PRAGMA enable_external_access = true", "a SET statement (changes settings) is not allowed"),
    ("CALL pragma_version()", "a CALL statement"),
    ("SELECT * FROM checkpoint()", "the table function checkpoint is not allowed"),
    # passes the statement check: refused by the locked connection itself
    ("SELECT * FROM duckdb_extensions()", "outside the history, which is not allowed"),
]
WRITTEN_IF_ESCAPED = ("pwned.csv", "other.db", "exported")


def _plant(project: Path) -> None:
    """Files a query might try to read, and an import_database folder whose load.sql
    would write pwned.csv."""
    (project / "secret.csv").write_text("user,password\nroot,hunter2\n")
    (project / "secret.json").write_text('{"token": "s3cr3t"}\n')
    (project / "secret.parquet").write_bytes(b"PAR1" + b"\0" * 16 + b"PAR1")
    (project / "imp").mkdir()
    (project / "imp" / "schema.sql").write_text("")
    (project / "imp" / "load.sql").write_text(f"COPY (SELECT 42) TO '{project}/pwned.csv';\n")


@pytest.mark.parametrize("sql, fragment", SANDBOX, ids=[s for s, _ in SANDBOX])
def test_query_cannot_leave_the_history(project, sql, fragment):
    _plant(project)
    before = snapshot(project)
    code, out, err = invoke(project, "query", sql.format(p=project))
    assert_clean_failure(code, out, err, 2, fragment)
    assert "query can only read" in err or "query is read-only" in err
    assert "hunter2" not in out + err and "s3cr3t" not in out + err and "root:" not in out
    assert snapshot(project) == before
    for name in WRITTEN_IF_ESCAPED:
        assert not (project / name).exists()


def test_import_database_refused_in_a_real_process(project):
    _plant(project)
    before = snapshot(project)
    proc = run_cli(project, "query", f"PRAGMA import_database('{project}/imp')")
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2,
                         "PRAGMA import_database reads files outside the history and is not allowed")
    assert not (project / "pwned.csv").exists()
    assert snapshot(project) == before


@pytest.mark.parametrize("cache", [True, False], ids=["cached", "in-memory"])
def test_the_connection_itself_is_locked(project, cache):
    """Below the statement check: whatever SQL reaches the connection, DuckDB reads no
    file (not even the history's own JSONL) and its settings cannot be unlocked."""
    _plant(project)
    history = next((project / "store" / "runs").glob("*.jsonl"))
    with connect(project / "store", cache=cache) as a:
        assert a.cached is cache
        for sql in (f"SELECT * FROM read_text('{project}/secret.csv')", f"SELECT * FROM read_text('{history}')",
                    f"COPY (SELECT 1) TO '{project}/pwned.csv'", f"ATTACH '{project}/other.db'"):
            with pytest.raises(duckdb.PermissionException):
                a.con.execute(sql)
        settings = ("enable_external_access", "lock_configuration", "temp_directory", "allowed_directories")

        def current():
            return {name: a.con.execute(f"SELECT current_setting('{name}')").fetchone()[0] for name in settings}

        locked = current()
        assert locked["enable_external_access"] is False and locked["lock_configuration"] is True
        for sql in ("SET enable_external_access = true", "SET lock_configuration = false",
                    "SET temp_directory = '.'", "SET allowed_directories = ['/']"):
            with pytest.raises(duckdb.Error):
                a.con.execute(sql)
            assert current() == locked, sql   # refused, and nothing changed
        assert a.query("SELECT count(*) FROM results").rows[0][0] > 0
    assert not (project / "pwned.csv").exists() and not (project / "other.db").exists()


def test_queries_reports_and_the_cache_still_work(project):
    [record_run], [check_run] = run_ids(project, "record"), run_ids(project, "check")
    code, out, err = invoke(project, "query", "--format", "csv",
                                "SELECT command, count(*) AS n FROM runs GROUP BY ALL ORDER BY ALL")
    assert code == 0, err
    assert out.split() == ["command,n", "check,1", "record,1"]
    code, out, _ = invoke(project, "query", "--schema")
    assert code == 0 and "infer_ms_all" in out
    code, out, _ = invoke(project, "query", "PRAGMA table_info('results')")
    assert code == 0 and "test_id" in out
    code, out, _ = invoke(project, "report", "support", "--format", "csv")
    assert code == 0 and "add,PASS" in out
    code, out, _ = invoke(project, "report", "latency", "--format", "csv")
    assert code == 0 and "torch_cpu_fp32" in out
    code, out, _ = invoke(project, "diff-runs", record_run, check_run)
    assert code == 0 and "newly failing" in out
    code, out, err = invoke(project, "report", "html", "-o", "report.html")
    assert code == 0, err
    assert "Support matrix" in (project / "report.html").read_text()
    with connect(project / "store") as a:   # the cache is up to date: nothing re-read
        assert a.cached and a.files_read == 0
        assert a.query("SELECT count(*) FROM results").rows[0][0] == 8


# ---------------------------------------------------------------- query limits

# a trillion rows to count: hours of work in a few megabytes
RUNAWAY = "SELECT count(*) FROM range(10000000) a, range(100000) b, range(1000) c"
# a full sort of a hundred million rows: far more memory than a small limit
HUNGRY = "SELECT max(x) FROM (SELECT i AS x FROM range(100000000) t(i) ORDER BY i DESC OFFSET 1)"


@pytest.mark.slow
def test_ctrl_c_stops_a_runaway_query(project):
    history = tree_bytes(project / "store" / "runs")
    cache = project / "store" / "cache.duckdb"
    cache.unlink(missing_ok=True)
    before = snapshot(project)
    code, out, err, _ = query_interrupted(project, RUNAWAY, 1.0)
    assert_clean_failure(code, out, err, 130, "opdiff: interrupted; the query was stopped")
    assert out == ""
    assert tree_bytes(project / "store" / "runs") == history
    assert snapshot(project) == before


@pytest.mark.slow
def test_a_query_past_its_time_limit_is_stopped(project):
    history = tree_bytes(project / "store" / "runs")
    proc = run_cli(project, "query", "--timeout-s", "1", RUNAWAY, timeout=120)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, "was stopped after 1 s, its time limit")
    assert "--timeout-s" in proc.stderr and proc.stdout == ""
    (project / "pyproject.toml").write_text("[tool.opdiff]\nquery-timeout-s = 1.5\n")
    proc = run_cli(project, "query", RUNAWAY, timeout=120)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, "was stopped after 1.5 s, its time limit")
    assert "query-timeout-s in [tool.opdiff]" in proc.stderr
    assert tree_bytes(project / "store" / "runs") == history


def test_a_query_past_its_memory_limit_is_stopped(project):
    history = tree_bytes(project / "store" / "runs")
    proc = run_cli(project, "query", "--memory-limit", "64MB", HUNGRY, timeout=120)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2,
                         "needed more memory than its limit of 64MB (--memory-limit")
    (project / "pyproject.toml").write_text('[tool.opdiff]\nquery-memory-limit = "48MiB"\n')
    code, out, err = invoke(project, "query", HUNGRY)
    assert_clean_failure(code, out, err, 2, "needed more memory than its limit of 48MiB")
    assert "query-memory-limit in [tool.opdiff]" in err
    assert tree_bytes(project / "store" / "runs") == history


def test_reports_run_under_the_same_limits(project):
    """The reports' own SQL runs under the limits too (1 MiB is too little for any of it)."""
    [record_run], [check_run] = run_ids(project, "record"), run_ids(project, "check")
    for args in (("report", "support"), ("report", "latency"), ("report", "html", "-o", "r.html"),
                 ("report", "upgrade", record_run, check_run, "-o", "u.html"),
                 ("diff-runs", record_run, check_run)):
        code, out, err = invoke(project, *args, "--memory-limit", "1MiB")
        assert_clean_failure(code, out, err, 2, "needed more memory than its limit of 1MiB (--memory-limit")
    code, out, err = invoke(project, "report", "support", "--memory-limit", "64MB", "--timeout-s", "60")
    assert code == 0 and "add" in out, err


# ---------------------------------------------------------------- bounded YAML

def _bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\ntests: []\n"


@pytest.mark.slow
def test_alias_bomb_fails_fast_in_little_memory(project):
    """A billion-laughs suite: one level more and the expansion would hold 10**9 values.
    Refused from the node graph before anything is expanded; the CLI needs about
    0.8 GiB of address space here (torch), so 1.5 GiB leaves nothing for expansion."""
    (project / "suites" / "bomb.yaml").write_text(_bomb())
    before = snapshot(project)
    started = time.monotonic()
    proc = run_cli(project, "validate", "suites/bomb.yaml", address_space=3 * 2**29, timeout=120)
    elapsed = time.monotonic() - started
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2,
                         "the document holds more than 1,000,000 values once its aliases are expanded")
    assert "suites/bomb.yaml:" in proc.stderr
    assert elapsed < 60, f"took {elapsed:.1f} s"
    assert snapshot(project) == before


DEEP_CASES = {
    # 100,000 nested brackets crash libyaml's composer (a segfault), and newer libyaml
    # stops scanning them at a nesting limit of its own: ours must speak first
    "flow": ("tests: " + "[" * 100_000 + "]" * 100_000 + "\n", "suites/deep.yaml:1:207:"),
    "block": ("tests:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(1_500)) + "  " * 1_501 + "x: 1\n",
              "suites/deep.yaml:"),
}


@pytest.mark.parametrize("kind", sorted(DEEP_CASES))
def test_nesting_too_deep_for_the_parser_is_refused(project, kind):
    """The depth cap is ours (200 levels, the suite's top mapping is level 1) and is
    reported as ours whatever limits the installed YAML parser has."""
    text, where = DEEP_CASES[kind]
    (project / "suites" / "deep.yaml").write_text(text)
    before = snapshot(project)
    proc = run_cli(project, "validate", "suites/deep.yaml")
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, where, "nesting deeper than 200 levels")
    assert snapshot(project) == before


def test_a_parser_error_is_wrapped_in_ours(project):
    """Whatever the parser says about broken syntax reaches the user inside our message,
    which names the file and the position."""
    (project / "suites" / "broken.yaml").write_text("tests:\n  - id: a\n    op: [aten::add\n")
    proc = run_cli(project, "validate", "suites/broken.yaml")
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, "suites/broken.yaml:", "YAML syntax error")


def _alias_chain(n: int) -> str:
    return "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, n)) + "tests: []\n"


YAML_CASES = [
    ("random.yaml", b"\xff" + os.urandom(4095), "random.yaml:1:1:", "not UTF-8 text (byte 0xff at offset 0)"),
    ("huge.yaml", b"tests: []\n#" + b"x" * (16 * 2**20), "huge.yaml:", "larger than 16 MiB"),
    ("many.yaml", ("tests: []\nx: [" + "0, " * 1_000_001 + "0]\n").encode(), "many.yaml:2:",
     "the document holds more than 1,000,000 values"),
    ("chain.yaml", _alias_chain(300).encode(), "chain.yaml:", "nesting deeper than 200 levels"),
    ("includes_a_dir.yaml", b"include: [models_dir]\ntests: []\n", "models_dir",
     "is a directory, not a YAML file"),
]


@pytest.mark.parametrize("name, data, where, fragment", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_broken_suite_files_name_the_file(project, name, data, where, fragment):
    (project / "suites" / "models_dir").mkdir()
    (project / "suites" / name).write_bytes(data)
    before = snapshot(project)
    code, out, err = invoke(project, "validate", f"suites/{name}")
    assert_clean_failure(code, out, err, 2, fragment)
    assert where in err
    assert snapshot(project) == before


def test_a_broken_suite_among_many_fails_record_before_anything_runs(project):
    (project / "suites" / "zz_random.yaml").write_bytes(b"\xfe\xff" * 2048)
    before, goldens = snapshot(project), tree_bytes(project / "goldens")
    code, out, err = invoke(project, "record", *FAST)
    assert_clean_failure(code, out, err, 2, "zz_random.yaml:1:1: not UTF-8 text (byte 0xfe at offset 0)")
    assert snapshot(project) == before and tree_bytes(project / "goldens") == goldens


# ---------------------------------------------------------------- paths of the wrong kind

PATH_CASES = [
    (("--goldens", "afile", "record", *FAST), "the golden store afile is a file, not a folder"),
    (("--goldens", "afile", "check", "-b", "torch_cpu_fp32"), "the golden store afile is a file"),
    (("--goldens", "afile", "goldens", "verify"), "the golden store afile is a file"),
    (("--goldens", "afile", "goldens", "ls"), "the golden store afile is a file"),
    (("--goldens", "afile", "goldens", "prune", "--yes"), "the golden store afile is a file"),
    (("--goldens", "afile", "goldens", "show", "add"), "the golden store afile is a file"),
    (("--store", "afile", "check", "-b", "torch_cpu_fp32"), "the history store afile is a file, not a folder"),
    (("--store", "afile", "record", "--force", *FAST), "the history store afile is a file, not a folder"),
    (("--store", "afile", "runs"), "the history store afile is a file, not a folder"),
    (("--store", "afile", "query", "SELECT 1"), "the history store afile is a file, not a folder"),
    (("--store", "afile", "report", "support"), "the history store afile is a file, not a folder"),
    (("--cache", "afile", "check", "-b", "torch_cpu_fp32"), "the artifact cache afile is a file, not a folder"),
    (("--suites", "afile", "record"), "the suites directory afile is a file"),
    (("--suites", "afile", "goldens", "ls"), "the suites directory afile is a file"),
    (("validate", "adir"), "adir is a directory holding no YAML suite"),
    (("record", "adir", *FAST), "adir is a directory holding no YAML suite"),
    (("check", "-b", "torch_cpu_fp32", "adir"), "adir is a directory holding no YAML suite"),
    (("check", "-b", "torch_cpu_fp32", "--junit", "adir"), "--junit adir is a directory"),
    (("report", "html", "-o", "adir"), "-o/--output adir is a directory"),
    (("report", "support", "--png", "adir"), "--png adir is a directory"),
    (("report", "latency", "--png-dir", "afile"), "--png-dir afile is a file"),
    (("record", "--backend-overrides-file", "binary.json", *FAST), "cannot read it as UTF-8"),
    (("check", "-b", "torch_cpu_fp32", "--preset-options", "torch_cpu_fp32=binary.json"),
     "cannot read it as UTF-8"),
]


@pytest.mark.parametrize("args, fragment", PATH_CASES, ids=[" ".join(a) for a, _ in PATH_CASES])
def test_paths_of_the_wrong_kind(project, args, fragment):
    (project / "afile").write_text("not a folder\n")
    (project / "adir").mkdir()
    (project / "adir" / "notes.txt").write_text("no suites here\n")
    (project / "binary.json").write_bytes(b"\xff\xfe{\x00")
    before, goldens = snapshot(project), tree_bytes(project / "goldens")
    code, out, err = invoke(project, *args)
    assert_clean_failure(code, out, err, 2, fragment)
    assert snapshot(project) == before
    assert tree_bytes(project / "goldens") == goldens


@pytest.mark.parametrize("table, fragment", [
    (b"[tool.opdiff]\ngoldens = 3\n", "[tool.opdiff] goldens must be a path"),
    (b"[tool.opdiff]\ntimeout_s = nan\n", "timeout_s must be a finite number of seconds"),
    (b"[tool.opdiff]\ntimeout_s = inf\n", "timeout_s must be a finite number of seconds"),
    (b"[tool.opdiff]\nname = '\xff\xfe'\n", "not valid TOML"),
    (b"[tool.opdiff]\nquery-memory-limit = 5\n", "query-memory-limit: 5 is not a memory size"),
    (b"[tool.opdiff]\nquery-memory-limit = '1KB'\n", "query-memory-limit: '1KB' is too small"),
    (b"[tool.opdiff]\nquery-timeout-s = nan\n", "query-timeout-s must be a finite number of seconds"),
], ids=["path-not-string", "nan", "inf", "not-utf8", "memory-not-a-size", "memory-too-small", "query-timeout-nan"])
def test_broken_pyproject_settings(project, table, fragment):
    (project / "pyproject.toml").write_bytes(table)
    before = snapshot(project)
    code, out, err = invoke(project, "goldens", "ls")
    assert_clean_failure(code, out, err, 2, fragment)
    assert "pyproject.toml" in err
    assert snapshot(project) == before


# ---------------------------------------------------------------- read-only stores

def _read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)


def _writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)


needs_permissions = pytest.mark.skipif(not can_drop_dac(), reason="cannot make a child process honour file "
                                                                  "permissions here (root without CAP_SETPCAP)")


@pytest.mark.slow
@needs_permissions
@pytest.mark.parametrize("args, store, fragment", [
    (("record", "--force", *FAST), "goldens", "cannot write to the golden store goldens (Permission denied"),
    (("record", *FAST), "goldens", "cannot write to the golden store goldens (Permission denied"),
    (("record", "--force", *FAST), "store", "cannot create a run file in store/runs (Permission denied)"),
    (("check", "-b", "torch_cpu_fp32", *FAST), "store", "cannot create a run file in store/runs (Permission"),
], ids=["record-force-goldens", "record-new-test-goldens", "record-store", "check-store"])
def test_read_only_stores(project, args, store, fragment):
    if args == ("record", *FAST):   # a new test, so that plain record has something to write
        with open(project / "suites" / "s.yaml", "a") as f:
            f.write("  - id: tanh\n    op: aten::tanh\n    in: [{type: tensor, shape: [3], dtype: float32}]\n")
    before, goldens, runs = snapshot(project), tree_bytes(project / "goldens"), tree_bytes(project / "store")
    _read_only(project / store)
    try:
        proc = run_cli(project, *args, read_only_honoured=True)
    finally:
        _writable(project / store)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, fragment)
    assert "nothing was" in proc.stderr
    assert snapshot(project) == before
    assert tree_bytes(project / "goldens") == goldens
    assert tree_bytes(project / "store") == runs
    code, out, _ = invoke(project, "goldens", "verify")
    assert code == 0 and "4 goldens checked, 0 corrupt" in out


@pytest.mark.slow
@needs_permissions
def test_read_only_artifact_cache_falls_back_with_a_warning(project):
    from opdiff_snap.backends.registry import availability, get_preset

    if not availability(get_preset("onnx_cpu_fp32")).can_run:
        pytest.skip("onnx_cpu_fp32 (a preset whose artifacts are cached) does not run here")
    shutil.rmtree(project / ".opdiff-cache", ignore_errors=True)   # the recorded project's checks kept suites there
    (project / ".opdiff-cache").mkdir()
    before, goldens = snapshot(project), tree_bytes(project / "goldens")
    _read_only(project / ".opdiff-cache")
    try:
        proc = run_cli(project, "check", "-b", "onnx_cpu_fp32", "--test-ids", "add", "--format", "json", *FAST,
                       read_only_honoured=True)
    finally:
        _writable(project / ".opdiff-cache")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning: the artifact cache .opdiff-cache cannot be written (Permission denied); this check " \
           "exports without it" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [r["status"] for r in report["results"]] == ["PASS"]
    meta = json.loads((project / report["history"]).read_text().splitlines()[0])
    assert meta["settings"]["cache"] is False
    assert list((project / ".opdiff-cache").iterdir()) == []
    assert snapshot(project) == before and tree_bytes(project / "goldens") == goldens


# ---------------------------------------------------------------- a full disk

@pytest.mark.slow
def test_full_disk_during_record_keeps_every_complete_golden(project):
    """RLIMIT_FSIZE 64 KiB: the small goldens are rewritten, the big one (384 KiB) cannot
    be; the run stops with a clear error and the big golden recorded before is intact."""
    big = golden_meta(project, "big").parent
    big_before = tree_bytes(big)
    before = snapshot(project)
    proc = run_cli(project, "record", "--force", *FAST, fsize=64 * 2**10)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2,
                         "cannot write the golden of test 'big' seed 0 into the golden store goldens "
                         "(File too large)")
    assert "Goldens already in the store are untouched" in proc.stderr
    assert tree_bytes(big) == big_before
    for debris in (".staging", ".trash"):
        assert [p.name for p in (project / "goldens" / debris).iterdir()] == ["zarr.json"]
    code, out, _ = invoke(project, "goldens", "verify")
    assert code == 0 and "4 goldens checked, 0 corrupt" in out
    assert snapshot(project) == before


@pytest.mark.slow
def test_full_disk_during_check_stops_cleanly_and_resumes(project):
    """The run file may grow by the meta line, one item and half of the next: the check
    stops with a clear error, the goldens are untouched, and --resume finishes the run."""
    [check_run] = run_ids(project, "check")
    lines = (project / "store" / "runs" / f"{check_run}.jsonl").read_bytes().splitlines(keepends=True)
    limit = len(lines[0]) + len(lines[1]) + len(lines[2]) // 2
    before, goldens = snapshot(project), tree_bytes(project / "goldens")
    old_runs = set(run_ids(project))
    proc = run_cli(project, "check", "-b", "torch_cpu_fp32", *FAST, fsize=limit)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, "cannot append to the run file")
    [new] = set(run_ids(project)) - old_runs
    assert f"`opdiff check --resume {new}` finishes it" in proc.stderr
    assert tree_bytes(project / "goldens") == goldens and snapshot(project) == before
    assert (project / "store" / "runs" / f"{new}.jsonl").stat().st_size == limit
    proc = run_cli(project, "check", "-b", "torch_cpu_fp32", "--resume", new, "--format", "json", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(r["status"] for r in json.loads(proc.stdout)["results"]) == ["PASS"] * 4
    with connect(project / "store", warn=False) as a:
        assert a.query(f"SELECT complete FROM runs WHERE run_id = '{new}'").rows == [(True,)]
        assert a.query(f"SELECT count(*) FROM results WHERE run_id = '{new}'").rows == [(4,)]


# ---------------------------------------------------------------- goldens edited by hand

def _retype(a):
    a["tensors"]["args.0"]["dtype"] = "float64"


def _reshape(a):
    a["tensors"]["args.0"]["shape"] = [2, 5]


def _drop(a):
    del a["tensors"]["outputs.0"]


def _garble(a):
    a["definition"] = {"call": "garbage", "inputs": 3}


def _not_an_object(a):
    a["definition"] = "garbage"


def _edit_op(a):
    a["definition"]["call"]["target"] = "aten::sub.Tensor"


def _edit_module(a):
    a["definition"]["impl"] = "edited"


def _bad_index(a):
    a["outputs"] = {"tuple": [{"tensor": 3}]}


def _bad_dtype_node(a):
    a["kwargs"] = {"dict": [["dtype", {"dtype": "os.system"}]]}


TAMPERS = [
    ("dtype", "add", _retype, "CORRUPT", "tensor 'args.0': dtype 'float64' is not the NumPy dtype float32 "
                                         "is stored as ('float32')"),
    ("shape", "add", _reshape, "CORRUPT", "tensor 'args.0': shape [2, 5] of float32 takes 40 bytes, but "
                                          "nbytes says 32"),
    ("dropped-tensor", "relu", _drop, "CORRUPT", "outputs refers to tensor 'outputs.0', which the golden "
                                                 "does not hold"),
    ("garbled-definition", "add", _garble, "CORRUPT", "its definition does not rebuild into a test"),
    ("definition-not-an-object", "relu", _not_an_object, "CORRUPT", "attribute 'definition' is str, not a "
                                                                    "JSON object"),
    ("edited-op-definition", "add", _edit_op, "CORRUPT", "the definition was changed after record"),
    ("edited-module-definition", "scale", _edit_module, "STALE", "or the definition was edited"),
    ("tensor-index", "relu", _bad_index, "CORRUPT", "outputs: its tensor indices [3] are not 0..0"),
    ("dtype-node", "add", _bad_dtype_node, "CORRUPT", "kwargs['dtype']: 'os.system' is not a torch dtype"),
]


@pytest.mark.parametrize("test_id, change, kind, fragment", [t[1:] for t in TAMPERS], ids=[t[0] for t in TAMPERS])
def test_verify_and_check_agree_on_edited_goldens(project, test_id, change, kind, fragment):
    edit_attrs(project, test_id, change)
    before = snapshot(project)
    code, out, err = invoke(project, "goldens", "verify")
    assert_clean_failure(code, out, err, 1, f"{kind} {test_id} seed=0: ")
    assert fragment in out
    assert sum(line.startswith(("CORRUPT", "STALE")) for line in out.splitlines()) == 1
    # check, with the suites: the golden is never compared
    code, out, err = invoke(project, "check", "-b", "torch_cpu_fp32", "--test-ids", test_id, "--format",
                                "json", *FAST)
    assert_clean_failure(code, out, err, 1, "CORRUPT")
    [result] = json.loads(out)["results"]
    assert result["status"] == "CORRUPT", result
    # check from the goldens alone: the same verdict; a test whose file: module no suite given
    # vouches for (its recorded suite path never does) is refused before anything runs
    code, out, err = invoke(project, "--suites", "no-suites-here", "check", "-b", "torch_cpu_fp32",
                                "--test-ids", test_id, "--format", "json", *FAST)
    if test_id == "scale":
        assert_clean_failure(code, out, err, 2, "'scale' seed 0: file:models.py::Scale")
    else:
        assert "Traceback" not in out + err
        [result] = json.loads(out)["results"]
        assert result["status"] == "CORRUPT", result
    assert snapshot(project) == before


def test_verify_notes_a_spec_hash_it_cannot_check(project, tmp_path):
    """Run from another folder, a golden's file: module is not found: verify says so and
    does not call the golden corrupt."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, err = invoke(elsewhere, "--goldens", str(project / "goldens"), "goldens", "verify")
    assert code == 0, out + err
    assert "UNCHECKED scale seed=0: spec hash not checked: the file: module" in out
    assert "4 goldens checked, 0 corrupt, 1 with a spec hash not checked from here" in out


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    return proc.returncode == 0


@pytest.mark.slow
def test_a_really_full_disk_during_record(project, tmp_path):
    """The same on a 256 KiB tmpfs, where writes fail with ENOSPC (needs root that may
    mount; skipped elsewhere, the RLIMIT_FSIZE test above covers the rest)."""
    small = tmp_path / "small"
    if not _mount_tmpfs(small, "256k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        goldens = small / "goldens"
        proc = run_cli(project, "--goldens", str(goldens), "record", *FAST)
        assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2,
                             "cannot write the golden of test 'big' seed 0 into the golden store")
        assert "No space left on device" in proc.stderr
        assert [p.name for p in (goldens / ".staging").iterdir()] == ["zarr.json"]
        code, out, _ = invoke(project, "--goldens", str(goldens), "goldens", "verify")
        assert code == 0 and "3 goldens checked, 0 corrupt" in out
    finally:
        subprocess.run(["umount", str(small)], check=True)


QUERY_LIMIT_CASES = [
    (("query", "--timeout-s", "nan", "SELECT 1"), "--timeout-s 'nan': not a finite number"),
    (("report", "support", "--timeout-s", "0"), "--timeout-s '0'"),
    (("query", "--memory-limit", "lots", "SELECT 1"), "--memory-limit: 'lots' is not a memory size"),
    (("diff-runs", "a", "b", "--memory-limit", "-1GB"), "--memory-limit: '-1GB' is not a memory size"),
]


@pytest.mark.parametrize("args, fragment", QUERY_LIMIT_CASES, ids=[" ".join(a) for a, _ in QUERY_LIMIT_CASES])
def test_query_limit_flags_are_checked_when_parsed(project, args, fragment):
    before = snapshot(project)
    code, out, err = invoke(project, *args)
    assert_clean_failure(code, out, err, 2, f"opdiff: error: {fragment}")
    assert snapshot(project) == before
