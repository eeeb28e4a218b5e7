"""JSONL run files -> the `_runs`, `_results` and `_warnings` tables (SQL only).

Each line is read as raw JSON text (a truncated or corrupt line reads as NULL and
becomes a warning naming file and line), then shaped with explicit structures,
never DuckDB's auto-detection: meta and item lines share keys with different types,
and opdiff's own files nest their results under `backends[].res`.

The structure of an item, and so the columns of the `results` view, is derived from
results.Result (and its Tolerance and compare.Metrics): a field added there is a column
here, with no second list to keep in step.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any

from ..compare.metrics import NUMBERS, Metrics
from ..compare.results import JSON_KEYS, RES_FIELDS, Result
from ..core.limits import MAX_HISTORY_LINE_BYTES
from ..core.verdicts import OPDIFF_OK

_SQL = {str: "VARCHAR", int: "BIGINT", float: "DOUBLE", bool: "BOOLEAN"}


def sql_type(tp: Any) -> Any:
    """A Python annotation as this module's structure notation: a DuckDB type name, [type]
    for a list, {field: type} for a struct (a dataclass)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return "DOUBLE" if float in kinds else sql_type(kinds[0])
    if origin in (list, tuple):
        return [sql_type(args[0])]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "VARCHAR"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return fields_of(tp)
    return _SQL[tp]


def fields_of(cls: type) -> dict[str, Any]:
    """{JSON key: structure} of a dataclass's fields; a Result's metrics are the numbers of
    Metrics (what is kept beside them is nested JSON the views leave out)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if cls is Metrics and f.name not in NUMBERS:
            continue
        structure = fields_of(Metrics) if (cls is Result and f.name == "metrics") else sql_type(hints[f.name])
        out[JSON_KEYS.get(f.name, f.name) if cls is Result else f.name] = structure
    return out


METRICS = fields_of(Metrics)
_RESULT = fields_of(Result)
# The fields of one result, as our items write them at top level and as
# `backends[].res` objects hold them.
RESULT_FIELDS = {"preset": "VARCHAR", **{JSON_KEYS.get(n, n): _RESULT[JSON_KEYS.get(n, n)] for n in RES_FIELDS}}
ITEM = {"type": "VARCHAR", "run_id": "VARCHAR", "ts": "VARCHAR", "backends": "JSON", **_RESULT,
        "baseline": "JSON"}          # a preset name in ours, an object in opdiff's files
LIBS = ("python", "torch", "executorch", "onnxruntime", "onnx", "coremltools", "numpy",
        "opdiff_snap", "onnxscript", "torchao", "transformers", "torchvision", "plugins")
MACHINE = {"os_version": "VARCHAR", "executable": "VARCHAR",
           "cpu": {"model": "VARCHAR", "isa": ["VARCHAR"], "torch_capability": "VARCHAR"},
           "torch_build": {"blas": "VARCHAR", "onednn": "VARCHAR"},
           "threads": {"intra_op": "BIGINT"}}
META = {"type": "VARCHAR", "run_id": "VARCHAR", "command": "VARCHAR", "started": "VARCHAR",
        "host": "VARCHAR", "os": "VARCHAR", "machine": "VARCHAR", "suites": "JSON",
        "baseline_preset": "VARCHAR", "presets": "JSON", "run_group": "VARCHAR", "shard": "VARCHAR",
        "env": {**{k: "VARCHAR" for k in LIBS}, **MACHINE},
        # opdiff's meta line nests everything under "meta"
        "meta": {"created_at": "VARCHAR", "env": {k: "VARCHAR" for k in LIBS}},
        "finished": "VARCHAR", "wall_s": "DOUBLE"}
BACKEND = [{"name": "VARCHAR", "backend": "VARCHAR", "res": "JSON", "diff_all": "JSON",
            "times_all": "JSON"}]
OPDIFF_RES = [{"status": "VARCHAR", "ms": "DOUBLE"}]
OPDIFF_DIFF = [{"ok": "BOOLEAN", "max_abs": "DOUBLE"}]

METRIC_COLUMNS = [k for k in METRICS]
TOLERANCE_COLUMNS = list(RESULT_FIELDS["tolerance"])
# scalar fields of a result that are columns of their own (tolerance and metrics are spread)
SCALAR_COLUMNS = [k for k in RESULT_FIELDS if k not in ("preset", "tolerance", "metrics")]


def _s(structure) -> str:
    return "'" + json.dumps(structure).replace("'", "''") + "'"


def _ts(expr: str) -> str:
    return f"TRY_CAST(TRY_CAST({expr} AS TIMESTAMPTZ) AT TIME ZONE 'UTC' AS TIMESTAMP)"


TABLES_DDL = """
CREATE TABLE IF NOT EXISTS _files (file VARCHAR PRIMARY KEY, size BIGINT, mtime_ns BIGINT);
CREATE TABLE IF NOT EXISTS _warnings (file VARCHAR, line BIGINT, message VARCHAR);
"""


READ_COLUMNS = {**META, **ITEM, "type": "VARCHAR"}


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def stage_sql(files: list[str], copies: dict[str, str] | None = None) -> str:
    """Every line of `files`, parsed once into typed columns, with its line number and
    run segment (meta lines seen so far). A bad line is a row with every column NULL.
    `copies`: {file read: the run file it stands for} (analytics/long_lines.py)."""
    lst = "[" + ", ".join(map(_quote, files)) + "]"
    cols = ", ".join(f"'{k}': '{_struct_type(v)}'" for k, v in READ_COLUMNS.items())
    named = ("CASE file " + " ".join(f"WHEN {_quote(c)} THEN {_quote(o)}" for c, o in copies.items())
             + " ELSE file END") if copies else "file"
    return f"""
CREATE OR REPLACE TEMP TABLE _raw AS
  SELECT * REPLACE ({named} AS file)
  FROM read_json({lst}, format='newline_delimited', ignore_errors=true,
                 filename='file', columns={{{cols}}}, maximum_object_size={2 * MAX_HISTORY_LINE_BYTES});
CREATE OR REPLACE TEMP TABLE _staged AS
  SELECT *, row_number() OVER w AS line,
         sum(CASE WHEN type = 'meta' THEN 1 ELSE 0 END) OVER (w ROWS UNBOUNDED PRECEDING) AS seg
  FROM _raw WINDOW w AS (PARTITION BY file ORDER BY rowid);
DROP TABLE _raw;
"""


def _stem(col: str) -> str:
    return f"regexp_replace(regexp_replace({col}, '^.*[/\\\\]', ''), '\\.jsonl$', '')"


def _version(m: str, lib: str) -> str:
    v = f"coalesce({m}.env.{lib}, {m}.meta.env.{lib})"
    return f"split_part({v}, ' ', 1)" if lib == "python" else v


def runs_insert_sql() -> str:
    """One row per run id, from its meta line(s) and end line."""
    libs = ",\n    ".join(f"any_value({_version('m', k)} ORDER BY line) AS {k}" for k in LIBS)
    return f"""
CREATE OR REPLACE TEMP TABLE _segs AS
  SELECT file, seg, coalesce(run_id,
           {_stem('file')} || CASE WHEN seg > 1 THEN '#' || seg ELSE '' END) AS run_id
  FROM _staged WHERE type = 'meta';
INSERT INTO _runs
  SELECT s.run_id,
    any_value(m.command ORDER BY line) AS command,
    min({_ts("coalesce(m.started, m.meta.created_at)")}) AS started,
    max({_ts('e.finished')}) AS finished,
    bool_or(e.finished IS NOT NULL OR e.wall_s IS NOT NULL) AS complete,
    max(e.wall_s) AS wall_s,
    any_value(m.host ORDER BY line) AS host, any_value(m.os ORDER BY line) AS os,
    any_value(m.machine ORDER BY line) AS machine,
    {libs},
    any_value(m.env.os_version ORDER BY line) AS os_version,
    any_value(m.env.cpu.model ORDER BY line) AS cpu_model,
    any_value(m.env.cpu.isa ORDER BY line) AS cpu_isa,
    any_value(m.env.cpu.torch_capability ORDER BY line) AS cpu_capability,
    any_value(m.env.threads.intra_op ORDER BY line) AS threads,
    any_value(m.env.torch_build.blas ORDER BY line) AS blas,
    any_value(m.env.torch_build.onednn ORDER BY line) AS onednn,
    any_value(m.env.executable ORDER BY line) AS executable,
    any_value(CASE json_type(m.suites) WHEN 'ARRAY' THEN from_json(m.suites, '["VARCHAR"]')
                  WHEN 'VARCHAR' THEN [m.suites ->> '$'] END ORDER BY line) AS suites,
    any_value(CASE json_type(m.presets) WHEN 'OBJECT' THEN json_keys(m.presets)
                  WHEN 'ARRAY' THEN from_json(m.presets, '["VARCHAR"]') END ORDER BY line) AS presets,
    any_value(m.baseline_preset ORDER BY line) AS baseline_preset,
    min(file) AS file,
    any_value(m.run_group ORDER BY line) AS run_group,
    any_value(m.shard ORDER BY line) AS shard
  FROM (SELECT st.file, st.line, st.seg, st.type,
               {{{', '.join(f"'{k}': st.{k}" for k in META)}}} AS m
        FROM _staged st WHERE st.type IN ('meta', 'end')) x
  JOIN _segs s USING (file, seg)
  CROSS JOIN LATERAL (SELECT CASE WHEN x.type = 'end' THEN x.m END AS e)
  WHERE true
  GROUP BY s.run_id;
"""


def _result_cols(r: str) -> str:
    """Select list for result struct `r` (a json_transform of RESULT_FIELDS)."""
    special = {"infer_ms": f"coalesce({r}.infer_ms, list_median({r}.infer_ms_all))"}
    cols = [f"{special.get(k, f'{r}.{k}')} AS {k}" for k in SCALAR_COLUMNS]
    cols += [f"{r}.tolerance.{k} AS {k}" for k in TOLERANCE_COLUMNS]
    cols += [f"{r}.metrics.{k} AS {k}" for k in METRIC_COLUMNS]
    return ", ".join(cols)


def _opdiff_res(ol: str, dl: str) -> str:
    """The result struct for one of opdiff's own `res` lists `ol` (and `diff_all` list `dl`):
    the combined status (first non-OK), the median ms, max_abs; NULL for the rest."""
    known = {"status": f"coalesce(list_filter({ol}, lambda x: x.status <> '{OPDIFF_OK}')[1].status, {ol}[1].status)",
             "infer_ms": f"list_median(list_transform({ol}, lambda x: x.ms))",
             "infer_ms_all": f"list_filter(list_transform({ol}, lambda x: x.ms), lambda x: x IS NOT NULL)"}

    def literal(structure: Any, exprs: dict[str, str]) -> str:
        return "{" + ", ".join(f"'{k}': " + (literal(v, metric) if k == "metrics" else
                                             literal(v, {}) if isinstance(v, dict) else exprs.get(k, "NULL"))
                               for k, v in structure.items()) + "}"

    metric = {"max_abs": f"list_median(list_transform({dl}, lambda x: x.max_abs))"}
    return f"{literal(RESULT_FIELDS, known)}::{_struct_type(RESULT_FIELDS)}"


def results_insert_sql() -> str:
    """Flat items give one row; items without a flat `preset` (opdiff's own) give
    one row per `backends[]` entry, its fields taken from `res`."""
    common = """s.run_id, i.id AS test_id, i.seed, i.test_type, i.suite, i.spec_hash, i.tags"""
    base = ("CASE json_type(i.baseline) WHEN 'VARCHAR' THEN i.baseline->>'$' "
            "WHEN 'OBJECT' THEN coalesce(i.baseline->>'$.backend', i.baseline->>'$.name') END")
    # opdiff res lists: the combined status (first non-OK) and median ms; max_abs from diff_all
    opd_res = f"from_json(b.res, {_s(OPDIFF_RES)})"
    opd_diff = f"from_json(b.diff_all, {_s(OPDIFF_DIFF)})"
    return f"""
CREATE OR REPLACE TEMP VIEW _items AS
  SELECT st.file, st.line, st.seg, {{{', '.join(f"'{k}': st.{k}" for k in ITEM)}}} AS i
  FROM _staged st WHERE st.type = 'item';
INSERT INTO _results BY NAME
  SELECT {common}, i.preset, {base} AS baseline, {_result_cols('i')},
         {_ts('i.ts')} AS ts, file, line
  FROM _items LEFT JOIN _segs s USING (file, seg)
  WHERE i.preset IS NOT NULL OR i.status IS NOT NULL OR i.backends IS NULL
        OR json_type(i.backends) <> 'ARRAY';
INSERT INTO _results BY NAME
  SELECT {common}, i.baseline->>'$.backend' AS preset, i.baseline->>'$.backend' AS baseline,
         i.baseline->>'$.status' AS status, TRY_CAST(i.baseline->>'$.ms' AS DOUBLE) AS infer_ms,
         {_ts('i.ts')} AS ts, file, line
  FROM _items LEFT JOIN _segs s USING (file, seg)
  WHERE i.preset IS NULL AND i.status IS NULL AND json_type(i.backends) = 'ARRAY'
        AND json_type(i.baseline) = 'OBJECT' AND i.baseline->>'$.backend' IS NOT NULL;
CREATE OR REPLACE TEMP TABLE _bk AS
  SELECT file, line, seg, i, unnest(from_json(i.backends, {_s(BACKEND)})) AS b
  FROM _items
  WHERE i.preset IS NULL AND i.status IS NULL AND json_type(i.backends) = 'ARRAY';
INSERT INTO _results BY NAME
  SELECT {common}, coalesce(b.name, b.backend) AS preset, {base} AS baseline,
         {_result_cols('r')}, {_ts('i.ts')} AS ts, file, line
  FROM (SELECT *, CASE WHEN json_type(b.res) = 'OBJECT'
                       THEN json_transform(b.res, {_s(RESULT_FIELDS)}) END AS r0,
               CASE WHEN json_type(b.res) = 'ARRAY' THEN {opd_res} END AS ol,
               CASE WHEN json_type(b.diff_all) = 'ARRAY' THEN {opd_diff} END AS dl
        FROM _bk) q
  LEFT JOIN _segs s USING (file, seg)
  CROSS JOIN LATERAL (SELECT CASE WHEN r0 IS NOT NULL THEN r0 ELSE {_opdiff_res('ol', 'dl')} END AS r);
"""


def _struct_type(structure) -> str:
    if isinstance(structure, dict):
        return "STRUCT(" + ", ".join(f'"{k}" {_struct_type(v)}' for k, v in structure.items()) + ")"
    if isinstance(structure, list):
        return _struct_type(structure[0]) + "[]"
    return structure


def warnings_insert_sql() -> str:
    return f"""
INSERT INTO _warnings
  SELECT file, line, 'truncated or corrupt JSON line skipped' FROM _staged WHERE type IS NULL
    AND run_id IS NULL AND id IS NULL
  UNION ALL
  SELECT file, line, 'line longer than {MAX_HISTORY_LINE_BYTES:,} bytes (the most a history line may hold) '
         || 'skipped in run ' || {_stem('file')} FROM _staged WHERE type = 'oversized'
  UNION ALL
  SELECT file, line, 'result line before any meta line; run id taken from the item or file name'
    FROM _staged WHERE type = 'item' AND seg = 0
  UNION ALL
  SELECT file, line, 'line of unknown type ' || coalesce('''' || type || '''', 'null') || ' skipped'
    FROM _staged WHERE (type IS NOT NULL OR run_id IS NOT NULL OR id IS NOT NULL)
      AND (type IS NULL OR type NOT IN ('meta', 'item', 'end', 'recovered', 'oversized'));
"""


# What a measurement may be and still mean something: a time between a nanosecond and a day
# (a timer's zero, 1e-320 or 1e30 ms would turn every ratio into nonsense), an error finite
# and not negative. Anything else is left out of the statistics, with a warning.
PLAUSIBLE_MS = (1e-6, 86_400_000.0)
TIMED = ("export_ms", "load_ms", "infer_ms")
ERRORS = ("max_abs", "mean_abs", "mse", "max_rel")


def _implausible(col: str) -> str:
    if col in TIMED:
        lo, hi = PLAUSIBLE_MS
        return f"({col} IS NOT NULL AND NOT (isfinite({col}) AND {col} >= {lo!r} AND {col} <= {hi!r}))"
    return f"({col} IS NOT NULL AND NOT (isfinite({col}) AND {col} >= 0))"


def implausible_sql() -> str:
    """Measurements of the rows just read that cannot be real (non-finite, negative, beyond
    PLAUSIBLE_MS): one warning per result naming its run and test, and the values set to
    NULL, so that no latency or error statistic, and no finding, is made of them."""
    cols = TIMED + ERRORS
    bad = " OR ".join(_implausible(c) for c in cols) + (
        " OR len(list_filter(infer_ms_all, lambda x: x IS NULL OR NOT (isfinite(x) AND "
        f"x >= {PLAUSIBLE_MS[0]!r} AND x <= {PLAUSIBLE_MS[1]!r}))) > 0")
    which = " || ".join(f"CASE WHEN {_implausible(c)} THEN ' {c}=' || CAST({c} AS VARCHAR) ELSE '' END"
                        for c in cols)
    fresh = "file IN (SELECT DISTINCT file FROM _staged)"
    sets = ", ".join(f"{c} = CASE WHEN {_implausible(c)} THEN NULL ELSE {c} END" for c in cols)
    return f"""
INSERT INTO _warnings
  SELECT file, line, 'implausible measurement of test ' || coalesce(test_id, '?') || ' seed '
         || coalesce(CAST(seed AS VARCHAR), '?') || ' on ' || coalesce(preset, '?') || ' in run '
         || coalesce(run_id, '?') || ':' || {which}
         || CASE WHEN len(list_filter(infer_ms_all, lambda x: x IS NULL OR NOT (isfinite(x) AND
                 x >= {PLAUSIBLE_MS[0]!r} AND x <= {PLAUSIBLE_MS[1]!r}))) > 0
                 THEN ' infer_ms_all holds such values' ELSE '' END
         || '; left out of latency and error statistics'
  FROM _results WHERE {fresh} AND ({bad});
UPDATE _results SET {sets},
    infer_ms_all = list_filter(infer_ms_all, lambda x: x IS NOT NULL AND isfinite(x)
                               AND x >= {PLAUSIBLE_MS[0]!r} AND x <= {PLAUSIBLE_MS[1]!r})
  WHERE {fresh} AND ({bad});
"""


def fix_orphans_sql() -> str:
    """Items read before any meta line: run id from the item, else the file name."""
    return f"""
UPDATE _results SET run_id = coalesce(
    (SELECT i.run_id FROM _items WHERE _items.file = _results.file AND _items.line = _results.line),
    {_stem('_results.file')})
  WHERE run_id IS NULL AND file IN (SELECT DISTINCT file FROM _staged);
"""


RUNS_DDL = f"""
CREATE TABLE IF NOT EXISTS _runs (run_id VARCHAR, command VARCHAR, started TIMESTAMP,
  finished TIMESTAMP, complete BOOLEAN, wall_s DOUBLE, host VARCHAR, os VARCHAR, machine VARCHAR,
  {', '.join(f'{k} VARCHAR' for k in LIBS)}, os_version VARCHAR, cpu_model VARCHAR, cpu_isa VARCHAR[],
  cpu_capability VARCHAR, threads BIGINT, blas VARCHAR, onednn VARCHAR, executable VARCHAR, suites VARCHAR[],
  presets VARCHAR[], baseline_preset VARCHAR, file VARCHAR, run_group VARCHAR, shard VARCHAR);
"""
_COLUMNS = {"run_id": "VARCHAR", "test_id": "VARCHAR", "seed": "BIGINT", "test_type": "VARCHAR",
            "suite": "VARCHAR", "spec_hash": "VARCHAR", "tags": ["VARCHAR"], "preset": "VARCHAR",
            "baseline": "VARCHAR", **{k: RESULT_FIELDS[k] for k in SCALAR_COLUMNS},
            **RESULT_FIELDS["tolerance"], **METRICS, "ts": "TIMESTAMP", "file": "VARCHAR", "line": "BIGINT"}
RESULTS_DDL = ("CREATE TABLE IF NOT EXISTS _results ("
               + ", ".join(f"{k} {_struct_type(v)}" for k, v in _COLUMNS.items()) + ");")
VIEWS_DDL = """
CREATE OR REPLACE VIEW runs AS SELECT * FROM _runs;
CREATE OR REPLACE VIEW results AS SELECT * FROM _results;
"""
