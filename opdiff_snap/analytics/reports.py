"""Canned reports over the history views: support matrix, latency, run-to-run diff.

Every function takes the store folder or an open `Analytics` and returns `Table`s.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from ..core.errors import OpdiffError, suggest
from .findings import LOWERING_STEPS, QUANT_SQNR_DB
from .ingest import LIBS
from .table import Table
from .views import Analytics, connect

LIBRARIES = ("torch", "executorch", "onnxruntime", "onnx", "coremltools", "numpy", "python",
             "opdiff_snap")
DEFAULT_BASELINE = "torch_cpu_fp32"


@contextmanager
def _open(store: "str | os.PathLike | Analytics") -> Iterator[Analytics]:
    if isinstance(store, Analytics):
        yield store
    else:
        with connect(store) as a:
            yield a


def version_key(v: str | None) -> tuple:
    """Orders '1.9.0' < '1.10.0' < '1.10.1+cpu'; None first."""
    if v is None:
        return ()
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|[A-Za-z]+", v))


def _lib(by: str) -> str:
    if by not in LIBRARIES:
        raise OpdiffError(f"cannot group by '{by}'{suggest(by, LIBRARIES)}: choose one of "
                          f"{', '.join(LIBRARIES)}.")
    return by


# ---------------------------------------------------------------- support matrix

def latest_cells(store, by: str | None = None, command: str | None = "check") -> Table:
    """(test_id, preset, ver, verdict, exported): the latest verdict per test and preset
    (and version of `by`), the worst of its seeds' by verdicts.PRECEDENCE, from the latest
    run holding that test and preset; `exported`: every seed's export step ran (a CoreML
    conversion off macOS is UNAVAILABLE, yet exported)."""
    with _open(store) as a:
        ver = f"runs.{_lib(by)}" if by else "NULL"
        where = "coalesce(runs.command, 'check') = ?" if command else "?::VARCHAR IS NULL"
        return a.sql(f"""
            WITH cell AS (
              SELECT r.test_id, r.preset, {ver} AS ver, r.run_id, any_value(runs.started) AS started,
                     first(r.status ORDER BY verdict_rank(r.status) NULLS LAST, r.status) AS verdict,
                     bool_and(r.export_ms IS NOT NULL) AS exported
              FROM results r JOIN runs USING (run_id)
              WHERE {where} AND r.test_id IS NOT NULL AND r.preset IS NOT NULL
              GROUP BY ALL)
            SELECT test_id, preset, ver, verdict, exported FROM cell
            QUALIFY row_number() OVER (PARTITION BY test_id, preset, ver
                                       ORDER BY started DESC NULLS LAST, run_id DESC) = 1
        """, [command])


def support_matrix(store, by: str | None = None, command: str | None = "check") -> Table:
    """Tests x presets, the latest verdict per cell (latest_cells; PASS only when every seed
    passed). A status that is no verdict (opdiff's own files) ranks after every verdict, and
    such statuses by name.

    With `by` (a library name) the columns are `preset@version`: one column per preset
    and version of that library found in the history.
    """
    cells = [r[:4] for r in latest_cells(store, by, command).rows]
    cols = sorted({(p, v) for _, p, v, _ in cells}, key=lambda pv: (pv[0], version_key(pv[1])))
    names = [p if by is None else f"{p}@{v}" for p, v in cols]
    index = {pv: i for i, pv in enumerate(cols)}
    grid: dict[str, list] = {}
    for test, p, v, verdict in cells:
        grid.setdefault(test, [None] * len(cols))[index[(p, v)]] = verdict
    return Table(["test_id"] + names, [(k, *grid[k]) for k in sorted(grid)])


# ---------------------------------------------------------------- latency

@dataclass
class LatencyReport:
    baseline: str
    ratios: Table                  # preset, n, median_ratio, geomean_ratio, faster, slower
    trend: Table                   # run_id, started, preset, n, median_infer_ms
    samples: dict[str, list[float]] = field(default_factory=dict)   # preset -> ratios


def default_baseline(a: Analytics) -> str:
    row = a.sql("SELECT baseline_preset, count(*) FROM runs WHERE baseline_preset IS NOT NULL "
                "GROUP BY ALL ORDER BY 2 DESC, 1 LIMIT 1").rows
    return row[0][0] if row else DEFAULT_BASELINE


def latency_ratios(a: Analytics, baseline: str) -> dict[str, list[float]]:
    """preset -> [target infer_ms / baseline infer_ms] over (test, seed): the latest check
    result of each, against the baseline's timing from the same run where it ran there,
    else the latest baseline timing on the same host."""
    t = a.sql("""
        WITH t AS (SELECT r.run_id, r.test_id, r.seed, r.preset, r.infer_ms, runs.started, runs.host,
                          coalesce(runs.command, 'check') AS command
                   FROM results r JOIN runs USING (run_id) WHERE r.infer_ms > 0),
        tgt AS (SELECT * FROM t WHERE preset <> $1 AND command = 'check'
                QUALIFY row_number() OVER (PARTITION BY test_id, seed, preset
                                           ORDER BY started DESC NULLS LAST, run_id DESC) = 1),
        pair AS (SELECT tgt.preset, tgt.test_id, tgt.seed, tgt.infer_ms AS ms, b.infer_ms AS base_ms
                 FROM tgt JOIN t b ON b.preset = $1 AND b.test_id = tgt.test_id
                      AND b.seed IS NOT DISTINCT FROM tgt.seed AND b.host IS NOT DISTINCT FROM tgt.host
                 QUALIFY row_number() OVER (PARTITION BY tgt.preset, tgt.test_id, tgt.seed
                     ORDER BY (b.run_id = tgt.run_id) DESC, b.started DESC NULLS LAST, b.run_id DESC) = 1)
        SELECT preset, ms / base_ms FROM pair ORDER BY preset, test_id, seed
    """, [baseline])
    out: dict[str, list[float]] = {}
    for preset, ratio in t.rows:
        out.setdefault(preset, []).append(ratio)
    return out


def latency_trend(store, command: str | None = "check") -> Table:
    """Per run and preset: median infer_ms over its results, ordered by run start."""
    with _open(store) as a:
        where = "coalesce(runs.command, 'check') = ?" if command else "?::VARCHAR IS NULL"
        return a.sql(f"""
            SELECT r.run_id, any_value(runs.started) AS started, r.preset, count(*) AS n,
                   median(r.infer_ms) AS median_infer_ms
            FROM results r JOIN runs USING (run_id)
            WHERE r.infer_ms > 0 AND {where}
            GROUP BY r.run_id, r.preset ORDER BY started NULLS FIRST, r.run_id, r.preset
        """, [command])


def latency_report(store, baseline: str | None = None) -> LatencyReport:
    """Per preset: the median (and geometric mean) of infer_ms ratios against `baseline`
    (default: the runs' most common baseline preset), plus the per-run trend."""
    with _open(store) as a:
        base = baseline or default_baseline(a)
        samples = latency_ratios(a, base)
        rows = []
        for preset in sorted(samples):
            xs = samples[preset]
            geo = math.exp(sum(math.log(x) for x in xs) / len(xs))
            rows.append((preset, len(xs), statistics.median(xs), geo,
                         sum(x < 1 for x in xs), sum(x > 1 for x in xs)))
        ratios = Table(["preset", "n", "median_ratio", "geomean_ratio", "faster", "slower"], rows)
        return LatencyReport(base, ratios, latency_trend(a), samples)


# ---------------------------------------------------------------- run diff

DELEGATION_COLUMNS = ["test_id", "seed", "preset", "op", "fallback_a", "fallback_b", "change", "source"]


QUANTIZATION_COLUMNS = ["test_id", "seed", "preset", "change", "quant_sqnr_a", "quant_sqnr_b", "lowering_steps_a",
                        "lowering_steps_b", "calibration_changed"]


@dataclass
class RunDiff:
    a: str
    b: str
    label_a: str
    label_b: str
    newly_failing: Table
    newly_passing: Table
    drift: Table
    latency: Table
    only_a: int = 0
    only_b: int = 0
    environment: Table = field(default_factory=lambda: Table(["field", "a", "b"], []))
    # per (test, seed, preset, op) with delegation on both sides: fallback node counts that differ
    delegation: Table = field(default_factory=lambda: Table(DELEGATION_COLUMNS, []))
    # int8 results in both runs whose quantization error (the quantizer's) or lowering
    # error (the backend's) changed, each named apart
    quantization: Table = field(default_factory=lambda: Table(QUANTIZATION_COLUMNS, []))
    # every (test, seed, preset) timed in both runs: median_a, median_b, ratio (b / a)
    ratios: Table = field(default_factory=lambda: Table(["test_id", "seed", "preset", "median_a",
                                                         "median_b", "ratio"], []))

    def sections(self) -> list[tuple[str, Table]]:
        return [("environment differences", self.environment),
                ("newly failing", self.newly_failing), ("newly passing", self.newly_passing),
                ("metric drift", self.drift), ("latency changes", self.latency),
                ("delegation changes", self.delegation), ("int8 error changes", self.quantization)]

    def summary(self) -> str:
        return (f"{self.label_a} -> {self.label_b}: {len(self.newly_failing)} newly failing, "
                f"{len(self.newly_passing)} newly passing, {len(self.drift)} drifted, "
                f"{len(self.latency)} latency changes, {len(self.delegation)} delegation changes, "
                f"{len(self.quantization)} int8 error changes; "
                f"{self.only_a} results only in A, {self.only_b} only in B")


def resolve_runs(a: Analytics, ref: str) -> list[str]:
    """The run ids `ref` names: a run group (`check --run-group`: its shards, one logical
    run), or one run (see resolve_run)."""
    members = [r[0] for r in a.sql("SELECT run_id FROM runs WHERE run_group = $1 ORDER BY run_id", [ref]).rows]
    return members or [resolve_run(a, ref)]


def resolve_run(a: Analytics, ref: str) -> str:
    """A run id, or a unique part of one (its short hex suffix, say)."""
    ids = [r[0] for r in a.sql("SELECT run_id FROM runs ORDER BY started, run_id").rows]
    if ref in ids:
        return ref
    hits = [i for i in ids if ref in i]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise OpdiffError(f"run '{ref}' is ambiguous: it matches {', '.join(hits[:5])}"
                          f"{' ...' if len(hits) > 5 else ''}; give more of the run id.")
    raise OpdiffError(f"no run '{ref}' in the history{suggest(ref, ids)}; "
                      "`opdiff query \"SELECT run_id, started FROM runs\"` lists them.")


def runs_by_version(a: Analytics, by: str, versions: tuple[str, str] | None = None
                    ) -> tuple[tuple[str, str], tuple[str, str]]:
    """((version, run id) older, (version, run id) newer): the latest complete check run on
    each of two versions of library `by` (default: its two latest versions)."""
    col = _lib(by)
    t = a.sql(f"""SELECT {col}, run_id FROM runs
                  WHERE complete AND coalesce(command, 'check') = 'check' AND {col} IS NOT NULL
                  QUALIFY row_number() OVER (PARTITION BY {col}
                                             ORDER BY started DESC NULLS LAST, run_id DESC) = 1""")
    latest = dict(t.rows)
    if versions is None:
        have = sorted(latest, key=version_key)
        if len(have) < 2:
            raise OpdiffError(f"diff-runs --by {by} needs complete check runs on two versions of "
                              f"{by}; the history has {len(have)} ({', '.join(have) or 'none'}).")
        versions = (have[-2], have[-1])
    for v in versions:
        if v not in latest:
            raise OpdiffError(f"no complete check run with {by} {v}{suggest(v, latest)}; "
                              f"versions in the history: {', '.join(sorted(latest, key=version_key))}.")
    return (versions[0], latest[versions[0]]), (versions[1], latest[versions[1]])


def diff_runs(store, a: str | None = None, b: str | None = None, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, spread_k: float = 3.0) -> RunDiff:
    """Compare run A with run B per (test, seed, preset).

    - newly failing: passing in A, failing in B (verdicts.PASSING, FAILING); newly passing:
      the reverse. A result that was not run on either side (verdicts.NOT_RUN: SKIPPED,
      UNAVAILABLE, NO_GOLDEN, STALE) is neither.
    - drift: max_abs_b > drift_factor * max(max_abs_a, atol) (tiny values below atol ignored).
    - latency: |median_b - median_a| > max(latency_threshold * median_a,
      spread_k * max(IQR_a, IQR_b)), medians and IQRs over each result's infer_ms_all.
    With `by`, A and B are the latest complete check runs on two versions of that library.
    A or B may name a run group: its runs (the shards of one check) are taken together.
    """
    with _open(store) as an:
        if by is not None:
            (va, a), (vb, b) = runs_by_version(an, by, versions)
            label_a, label_b = f"{by} {va} ({a})", f"{by} {vb} ({b})"
            runs_a, runs_b = [a], [b]
        else:
            if a is None or b is None:
                raise OpdiffError("diff-runs needs two run ids (A B), or --by <library>.")
            runs_a, runs_b = resolve_runs(an, a), resolve_runs(an, b)
            label_a, label_b = (x if len(r) > 1 else r[0] for x, r in ((a, runs_a), (b, runs_b)))
            a, b = runs_a[0], runs_b[0]
        an.sql("""CREATE OR REPLACE TEMP TABLE _pair AS
            WITH ra AS (SELECT * FROM results WHERE list_contains($1::VARCHAR[], run_id)),
                 rb AS (SELECT * FROM results WHERE list_contains($2::VARCHAR[], run_id))
            SELECT coalesce(ra.test_id, rb.test_id) AS test_id, coalesce(ra.seed, rb.seed) AS seed,
                   coalesce(ra.preset, rb.preset) AS preset,
                   ra.test_id IS NOT NULL AS in_a, rb.test_id IS NOT NULL AS in_b,
                   ra.status AS status_a, rb.status AS status_b,
                   rb.error_class, rb.error_message,
                   ra.max_abs AS max_abs_a, rb.max_abs AS max_abs_b,
                   greatest(coalesce(rb.atol, ra.atol, 1e-5), 1e-12) AS atol,
                   coalesce(list_median(ra.infer_ms_all), ra.infer_ms) AS med_a,
                   coalesce(list_median(rb.infer_ms_all), rb.infer_ms) AS med_b,
                   coalesce(list_aggregate(ra.infer_ms_all, 'quantile_cont', 0.75)
                            - list_aggregate(ra.infer_ms_all, 'quantile_cont', 0.25), 0) AS iqr_a,
                   coalesce(list_aggregate(rb.infer_ms_all, 'quantile_cont', 0.75)
                            - list_aggregate(rb.infer_ms_all, 'quantile_cont', 0.25), 0) AS iqr_b
            FROM ra FULL OUTER JOIN rb ON ra.test_id = rb.test_id
                 AND ra.seed IS NOT DISTINCT FROM rb.seed AND ra.preset = rb.preset""", [runs_a, runs_b])
        key = "test_id, seed, preset"
        failing = an.sql(f"SELECT {key}, status_a, status_b, error_class, error_message FROM _pair "
                         f"WHERE verdict_passing(status_a) AND verdict_failing(status_b) ORDER BY {key}")
        passing = an.sql(f"SELECT {key}, status_a, status_b FROM _pair "
                         f"WHERE verdict_failing(status_a) AND verdict_passing(status_b) ORDER BY {key}")
        drift = an.sql(f"""SELECT {key}, max_abs_a, max_abs_b,
                              max_abs_b / greatest(max_abs_a, atol) AS factor FROM _pair
                           WHERE max_abs_b > $1 * greatest(coalesce(max_abs_a, 0), atol)
                                 AND max_abs_a IS NOT NULL
                           ORDER BY factor DESC, {key}""", [drift_factor])
        latency = an.sql(f"""SELECT {key}, med_a AS median_a, med_b AS median_b,
                                med_b / med_a AS ratio,
                                greatest($1 * med_a, $2 * greatest(iqr_a, iqr_b)) AS threshold
                             FROM _pair
                             WHERE med_a > 0 AND med_b > 0
                                   AND abs(med_b - med_a) > greatest($1 * med_a, $2 * greatest(iqr_a, iqr_b))
                             ORDER BY ratio DESC, {key}""", [latency_threshold, spread_k])
        ratios = an.sql(f"""SELECT {key}, med_a AS median_a, med_b AS median_b, med_b / med_a AS ratio
                            FROM _pair WHERE med_a > 0 AND med_b > 0 ORDER BY {key}""")
        only = an.sql("SELECT count(*) FILTER (WHERE NOT in_b), count(*) FILTER (WHERE NOT in_a) "
                      "FROM _pair").rows[0]
        an.sql("DROP TABLE _pair")
        env = environment_differences(an, a, b)
        delegation = delegation_changes(an, runs_a, runs_b)
        quantization = int8_changes(an, runs_a, runs_b)
    return RunDiff(a, b, label_a, label_b, failing, passing, drift, latency, only[0], only[1], env,
                   ratios=ratios, delegation=delegation, quantization=quantization)




def int8_changes(an: Analytics, runs_a: list[str], runs_b: list[str]) -> Table:
    """int8 results in both runs whose quantization error (the quantized reference against
    the golden: SQNR moved by more than QUANT_SQNR_DB, or the calibration data changed)
    or lowering error (the backend against the reference: more than LOWERING_STEPS, or
    only one side failed on it) changed. A new quantizer shows as the first, a new backend
    as the second."""
    return an.sql("""
        WITH ra AS (SELECT * FROM results WHERE list_contains($1::VARCHAR[], run_id)
                                                AND (quant_sqnr IS NOT NULL OR lowering_steps IS NOT NULL)),
             rb AS (SELECT * FROM results WHERE list_contains($2::VARCHAR[], run_id)
                                                AND (quant_sqnr IS NOT NULL OR lowering_steps IS NOT NULL)),
             j AS (SELECT ra.test_id, ra.seed, ra.preset, ra.quant_sqnr AS qa, rb.quant_sqnr AS qb,
                          ra.lowering_steps AS la, rb.lowering_steps AS lb,
                          ra.calibration IS DISTINCT FROM rb.calibration AS calibration_changed,
                          (coalesce(ra.quant_failed, '') = 'lowering') <> (coalesce(rb.quant_failed, '') = 'lowering')
                              AS lowering_flipped
                   FROM ra JOIN rb ON ra.test_id = rb.test_id AND ra.seed IS NOT DISTINCT FROM rb.seed
                        AND ra.preset = rb.preset),
             c AS (SELECT *, (abs(coalesce(qb, 0) - coalesce(qa, 0)) > $3 AND NOT (isinf(qa) AND isinf(qb))
                              OR (qa IS NULL) <> (qb IS NULL) OR calibration_changed) AS quant,
                             (abs(coalesce(lb, 0) - coalesce(la, 0)) > $4 + 0.001 OR lowering_flipped) AS lowering
                   FROM j)
        SELECT test_id, seed, preset,
               CASE WHEN quant AND lowering THEN 'quantization and lowering error'
                    WHEN quant THEN 'quantization error' ELSE 'lowering error' END AS change,
               qa AS quant_sqnr_a, qb AS quant_sqnr_b, la AS lowering_steps_a, lb AS lowering_steps_b,
               calibration_changed
        FROM c WHERE quant OR lowering
        ORDER BY preset, change, test_id, seed""", [runs_a, runs_b, QUANT_SQNR_DB, LOWERING_STEPS])


def delegation_changes(an: Analytics, runs_a: list[str], runs_b: list[str]) -> Table:
    """Ops that left the delegate (more of their nodes on the runtime's kernels in B) or
    joined it, per (test, seed, preset) that recorded delegation in both runs."""
    return an.sql("""
        WITH da AS (SELECT test_id, seed, preset, o.op AS op, o.fallback AS fb, o.sources AS src
                    FROM results, unnest(delegation.ops) AS t(o)
                    WHERE list_contains($1::VARCHAR[], run_id) AND delegation IS NOT NULL),
             db AS (SELECT test_id, seed, preset, o.op AS op, o.fallback AS fb, o.sources AS src
                    FROM results, unnest(delegation.ops) AS t(o)
                    WHERE list_contains($2::VARCHAR[], run_id) AND delegation IS NOT NULL),
             both_sides AS (SELECT DISTINCT test_id, seed, preset FROM da
                            INTERSECT SELECT DISTINCT test_id, seed, preset FROM db),
             joined AS (SELECT coalesce(da.test_id, db.test_id) AS test_id, coalesce(da.seed, db.seed) AS seed,
                               coalesce(da.preset, db.preset) AS preset, coalesce(da.op, db.op) AS op,
                               coalesce(da.fb, 0) AS fallback_a, coalesce(db.fb, 0) AS fallback_b,
                               coalesce(db.src[1], da.src[1]) AS source
                        FROM da FULL OUTER JOIN db ON da.test_id = db.test_id AND da.seed IS NOT DISTINCT FROM db.seed
                             AND da.preset = db.preset AND da.op = db.op)
        SELECT j.test_id, j.seed, j.preset, j.op, j.fallback_a, j.fallback_b,
               CASE WHEN j.fallback_b > j.fallback_a THEN 'left the delegate' ELSE 'joined the delegate' END
                   AS change, j.source
        FROM joined j JOIN both_sides b ON j.test_id = b.test_id AND j.seed IS NOT DISTINCT FROM b.seed
             AND j.preset = b.preset
        WHERE j.fallback_a <> j.fallback_b
        ORDER BY j.preset, j.op, j.test_id, j.seed""", [runs_a, runs_b])


ENVIRONMENT_COLUMNS = ("host", "os", "os_version", "machine", "cpu_model", "cpu_isa", "cpu_capability",
                       "threads", "blas", "onednn", "executable", *LIBS)


def environment_differences(a: Analytics, run_a: str, run_b: str) -> Table:
    """(field, value in A, value in B) for every machine or library fact the two runs differ in."""
    cols = ", ".join(ENVIRONMENT_COLUMNS)
    rows = {r[0]: r[1:] for r in a.sql(f"SELECT run_id, {cols} FROM runs WHERE run_id IN ($1, $2)",
                                        [run_a, run_b]).rows}
    va, vb = rows.get(run_a), rows.get(run_b)
    out = []
    if va is not None and vb is not None:
        for name, x, y in zip(ENVIRONMENT_COLUMNS, va, vb):
            if x != y:
                out.append((name, _env_text(x), _env_text(y)))
    return Table(["field", "a", "b"], out)


def _env_text(v) -> str:
    if isinstance(v, list):
        return " ".join(map(str, v))
    return "" if v is None else str(v)
