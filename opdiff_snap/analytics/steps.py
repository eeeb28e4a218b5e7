"""Steps in each (host, test, seed, preset) history, attributed to the environment change
between the runs on either side, or to none (docs/analytics.md, "Regressions across the history").

1. The check runs of each host, in start order, are cut into environment stretches: maximal
   runs of consecutive runs with the same versions, backend plugins and machine
   (ENV_FIELDS), and each stretch into at most BLOCKS blocks of consecutive runs.
2. DuckDB reduces every (series, stretch) to a segment: runs, median log latency, status
   counts, median max_abs, and its blocks' median log latency; and every series to its noise:
   the pooled standard deviation of log latency within its environments (else its (host,
   preset)'s, else its own bounded from above when it has few runs), never below the
   standard error the repeats within a run give.
3. Per segment of enough runs, the fit (stepfit.py) looks for a sustained step between its
   blocks: a change that no recorded environment change explains (a machine, a driver, a
   runtime built from source), reported as such. Per series, the fit over its segments (cut
   at those steps) finds the steps at environment changes. A series whose environments recur
   (A, B, A, B) is compared per environment instead. Status and max_abs changes compare the
   segments on either side.

The heavy work (1M results -> a row per segment) is one SQL statement; the fit sees only
series that changed environment or have a stretch long enough to hold a step.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass, field

import numpy as np

from ..core.verdicts import FAILING, NOT_RUN, PASSING, PRECEDENCE, Verdict
from .findings import (
    CHANGED,
    IMPROVEMENT,
    LOWERING_STEPS,
    QUANT_SQNR_DB,
    REGRESSION,
    Finding,
    environment_changes,
    matches_version,
)
from .ingest import LIBS
from .stepfit import (
    MAD,
    MEDIAN_SE,
    Step,
    StepParams,
    environment_steps,
    noise_bound,
    significant_steps,
    stretch_noise,
    stretch_steps,
)
from .views import Analytics

ENV_FIELDS = (*LIBS, "os_version", "cpu_model", "machine", "threads")
BLOCKS = 24        # a stretch of more runs is fitted over at most this many blocks of 3 runs or more
_RANK = {v: i for i, v in enumerate(PRECEDENCE)}


@dataclass(frozen=True)
class HistoryFilter:
    """Which part of the history to look at."""

    presets: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()          # globs over test ids
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    versions: tuple[str, ...] = ()       # findings whose change involves one of these (findings.matches_version)
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    """Consecutive runs of one stretch (one run each in a stretch of up to BLOCKS runs, else 3 or more)."""

    level: float                         # median ln(infer_ms)
    timed: int
    first_run: str
    started: dt.datetime | None          # when first_run started
    last_run: str


@dataclass
class Segment:
    first_run: str
    last_run: str
    started: dt.datetime | None
    runs: int
    timed: int
    level: float | None                  # median ln(infer_ms)
    statuses: dict[str, int]
    max_abs: float | None
    atol: float | None
    env: int | None = None               # hash of the environment (ENV_FIELDS)
    status: Verdict | None = None        # modal_status(statuses)
    quant_sqnr: float | None = None      # int8: median quantization error (dB)
    lowering_steps: float | None = None  # int8: median lowering error (steps)
    blocks: list[Block] = field(default_factory=list)   # when the stretch is long enough to hold a step

    def __post_init__(self) -> None:
        self.status = modal_status(self.statuses)


@dataclass
class Series:
    host: str | None
    test_id: str
    seed: int | None
    preset: str
    sigma: float
    within: float = 0.0                  # run-to-run noise inside its stretches (stepfit.stretch_noise)
    segments: list[Segment] = field(default_factory=list)


@dataclass(frozen=True)
class FilterSQL:
    """A HistoryFilter as SQL conditions on `runs` and on `results r`, with their parameters."""

    on_runs: str
    run_args: list
    on_results: str
    result_args: list

    @property
    def args(self) -> list:
        return self.run_args + self.result_args


def filter_sql(flt: HistoryFilter) -> FilterSQL:
    on_runs: list[str] = []
    on_results: list[str] = []
    run_args: list = []
    result_args: list = []
    if flt.hosts:
        on_runs.append("list_contains(?::VARCHAR[], runs.host)")
        run_args.append(list(flt.hosts))
    if flt.since is not None:
        on_runs.append("runs.started >= ?")
        run_args.append(flt.since)
    if flt.until is not None:
        on_runs.append("runs.started <= ?")
        run_args.append(flt.until)
    if flt.presets:
        on_results.append("list_contains(?::VARCHAR[], r.preset)")
        result_args.append(list(flt.presets))
    if flt.tests:
        on_results.append("(" + " OR ".join("r.test_id GLOB ?" for _ in flt.tests) + ")")
        result_args += list(flt.tests)
    return FilterSQL(" AND ".join(on_runs) or "true", run_args, " AND ".join(on_results) or "true", result_args)


def repeat_se_sql(r: str) -> str:
    """SQL: the standard error of ln(median) of result `r` from its repeats (NULL under 3)."""
    return (f"CASE WHEN len({r}.infer_ms_all) >= 3 AND list_min({r}.infer_ms_all) > 0 THEN {MAD * MEDIAN_SE} * "
            f"list_aggregate(list_transform({r}.infer_ms_all, lambda v: ln(v)), 'mad') "
            f"/ sqrt(len({r}.infer_ms_all)) END")


def _runs_sql(on_runs: str) -> str:
    """The check runs with, per host, their place in start order (ord), their environment
    stretch (grp), their place among the runs of their environment (nth) and their block of
    their stretch (blk: a run each in a stretch of up to BLOCKS runs, else at most BLOCKS
    blocks of at least 3 consecutive runs, so one outlying run moves no block's median)."""
    env = "hash([" + ", ".join(f"runs.{f}::VARCHAR" for f in ENV_FIELDS) + "])"
    return f"""
  SELECT * EXCLUDE (len), (row_number() OVER (PARTITION BY host, env, grp ORDER BY ord) - 1)
         * CASE WHEN len <= {BLOCKS} THEN len ELSE least({BLOCKS}, len // 3) END // len AS blk
  FROM (SELECT *, count(*) OVER (PARTITION BY host, env, grp) AS len FROM (
  SELECT *, row_number() OVER (PARTITION BY host ORDER BY started, run_id) AS ord,
         ord - row_number() OVER (PARTITION BY host, env ORDER BY started, run_id) AS grp,
         row_number() OVER (PARTITION BY host, env ORDER BY started, run_id) AS nth
  FROM (SELECT run_id, started, coalesce(host, '') AS host, {env} AS env FROM runs
        WHERE coalesce(command, 'check') = 'check' AND {on_runs})))"""


def _sql(on_runs: str, on_results: str, min_timed: int) -> str:
    # Segments are cut on the runs (1,000 rows, not 1M results): per host, the runs in start order
    # minus the runs in start order within one environment is constant on each stretch of one
    # environment ("gaps and islands"). A series missing from some runs may see one
    # environment as two segments; the fit then treats it as recurring. A segment of at least
    # `min_timed` timed runs brings its blocks' levels, for a step inside the stretch.
    return f"""
WITH re AS ({_runs_sql(on_runs)}),
x AS (
  SELECT hash(re.host, r.test_id, r.seed, r.preset) AS sid, re.host, r.test_id, r.seed, r.preset, re.ord,
         re.env, re.grp, re.blk, r.status, CASE WHEN r.infer_ms > 0 THEN ln(r.infer_ms) END AS lt,
         CASE WHEN re.nth <= 3 THEN {repeat_se_sql('r')} END AS rep, r.max_abs, r.atol, r.quant_sqnr,
         r.lowering_steps
  FROM results r JOIN re USING (run_id)
  WHERE r.test_id IS NOT NULL AND r.preset IS NOT NULL AND {on_results}),
seg AS MATERIALIZED (
  SELECT sid, env, grp, any_value(host) AS host, any_value(test_id) AS test_id, any_value(seed) AS seed,
         any_value(preset) AS preset, min(ord) AS first_ord, max(ord) AS last_ord, count(*) AS runs, count(lt) AS timed,
         median(lt) AS level, histogram(status) FILTER (WHERE status IS NOT NULL) AS statuses,
         median(max_abs) AS max_abs, max(atol) AS atol, median(rep) AS rep, median(quant_sqnr) AS quant_sqnr,
         median(lowering_steps) AS lowering_steps
  FROM x GROUP BY ALL),
blk AS (
  SELECT sid, env, grp, list([level, timed, first_ord, last_ord] ORDER BY blk) AS blocks
  FROM (SELECT sid, env, grp, blk, median(lt) AS level, count(lt)::DOUBLE AS timed, min(ord)::DOUBLE AS first_ord,
               max(ord)::DOUBLE AS last_ord
        FROM x WHERE lt IS NOT NULL AND (sid, env, grp) IN (SELECT (sid, env, grp) FROM seg WHERE timed >= {min_timed})
        GROUP BY ALL)
  GROUP BY ALL),
lvl AS (SELECT sid, env, count(lt) AS k, var_samp(lt) AS v FROM x GROUP BY ALL),
dev AS (SELECT sid, sqrt(sum((k - 1) * v) / sum(k - 1)) AS sd, sum(k - 1) AS df FROM lvl WHERE k >= 2 GROUP BY ALL),
n AS (SELECT sid, any_value(host) AS host, any_value(test_id) AS test_id, any_value(seed) AS seed,
             any_value(preset) AS preset, count(*) AS segs, max(timed) AS most, median(rep) AS rep
      FROM seg GROUP BY ALL)
SELECT n.sid, n.host, n.test_id, n.seed, n.preset, dev.sd, coalesce(dev.df, 0) AS df, n.segs, n.rep,
       s.first_ord, s.last_ord, s.runs, s.timed, s.level, s.statuses, s.max_abs, s.atol, s.env, s.quant_sqnr,
       s.lowering_steps, b.blocks
FROM n LEFT JOIN dev USING (sid) LEFT JOIN seg s ON (n.segs > 1 OR n.most >= {min_timed}) AND s.sid = n.sid
     LEFT JOIN blk b ON b.sid = s.sid AND b.env = s.env AND b.grp = s.grp
ORDER BY n.sid, s.first_ord
"""


def load_series(a: Analytics, flt: HistoryFilter, params: StepParams) -> list[Series]:
    """Every series that changed environment or has a stretch long enough to hold a step,
    with its segments and noise (one SQL statement)."""
    f = filter_sql(flt)
    t = a.sql(_sql(f.on_runs, f.on_results, 2 * params.min_runs), f.args)
    runs = {(host, ord_): (run_id, started) for run_id, started, host, ord_ in a.sql(
        f"SELECT run_id, started, host, ord FROM ({_runs_sql(f.on_runs)})", f.run_args).rows}
    c = {name: i for i, name in enumerate(t.columns)}
    noise = _noise(t.rows, c, params)
    out: list[Series] = []
    unknown: list[Series] = []       # no environment with enough runs, here or in its (host, preset)
    current, sid = None, None
    for row in t.rows:
        if row[c["first_ord"]] is None:
            continue
        host = row[c["host"]]
        if current is None or row[c["sid"]] != sid:
            sid, seed, rep = row[c["sid"]], row[c["seed"]], row[c["rep"]] or 0.0
            sd = noise(row)
            current = Series(host or None, row[c["test_id"]], seed, row[c["preset"]],
                             sigma=max(rep, params.noise_floor, sd or 0.0), within=max(rep, params.noise_floor))
            if sd is None:
                unknown.append(current)
            out.append(current)
        (first, started), (last, _) = runs[(host, row[c["first_ord"]])], runs[(host, row[c["last_ord"]])]
        blocks = [Block(level, int(timed), *runs[(host, int(lo))], runs[(host, int(hi))][0])
                  for level, timed, lo, hi in row[c["blocks"]] or ()]
        seg = Segment(first, last, started, row[c["runs"]], row[c["timed"]], row[c["level"]],
                      dict(row[c["statuses"]] or {}), row[c["max_abs"]], row[c["atol"]], row[c["env"]],
                      quant_sqnr=row[c["quant_sqnr"]], lowering_steps=row[c["lowering_steps"]], blocks=blocks)
        if current.segments and current.segments[-1].env == seg.env:
            current.segments[-1] = _joined(current.segments[-1], seg)   # the series skipped a run in between
        else:
            current.segments.append(seg)
    for s in unknown:   # the successive differences of its segment levels (steps included: never too small)
        levels = np.array([g.level for g in s.segments if g.level is not None])
        if len(levels) > 1:
            s.sigma = max(s.sigma, MAD * float(np.median(np.abs(np.diff(levels)))) / math.sqrt(2))
    _within_noise(out)
    return out


def _within_noise(series: list[Series]) -> None:
    """Each series' noise inside its stretches: its own (stepfit.stretch_noise), never below the
    median of those of its (host, preset), so a short series that happened to vary little
    does not make a step of the machine's load."""
    own: dict[int, float] = {}
    pooled: dict[tuple, list[float]] = {}
    for i, s in enumerate(series):
        noise = stretch_noise([(np.array([b.level for b in g.blocks]), np.array([b.timed for b in g.blocks]))
                               for g in s.segments if g.blocks])
        if noise is not None:
            own[i] = noise
            pooled.setdefault((s.host, s.preset), []).append(noise)
    pool = {k: float(np.median(v)) for k, v in pooled.items()}
    for i, s in enumerate(series):
        if i in own:
            s.within = max(s.within, own[i], pool[(s.host, s.preset)])


def _noise(rows: list, c: dict[str, int], params: StepParams):
    """row -> the run-to-run noise of its series: its own pooled deviation within environments
    when that has min_pool degrees of freedom; else the median of those of its (host, preset);
    else its own bounded from above (stepfit.noise_bound) when it has any; else None."""
    pooled: dict[tuple, list[float]] = {}
    for row in rows:
        if row[c["df"]] >= params.min_pool:
            pooled.setdefault((row[c["host"]], row[c["preset"]]), []).append(row[c["sd"]])
    pool = {k: float(np.median(v)) for k, v in pooled.items()}

    def noise(row) -> float | None:
        sd, df = row[c["sd"]], row[c["df"]]
        if df >= params.min_pool:
            return sd
        if (row[c["host"]], row[c["preset"]]) in pool:
            return pool[(row[c["host"]], row[c["preset"]])]
        return noise_bound(sd, df) if sd is not None and df >= 1 else None

    return noise


def _joined(a: Segment, b: Segment) -> Segment:
    """Two stretches of one environment that only runs without this series kept apart, as one
    (its level and max_abs: the run-weighted mean of the two medians)."""
    def mean(x: float | None, y: float | None, wx: int, wy: int) -> float | None:
        if x is None or y is None or wx + wy == 0:
            return x if y is None else y
        return (x * wx + y * wy) / (wx + wy)

    statuses = dict(a.statuses)
    for k, n in b.statuses.items():
        statuses[k] = statuses.get(k, 0) + n
    return Segment(a.first_run, b.last_run, a.started, a.runs + b.runs, a.timed + b.timed,
                   mean(a.level, b.level, a.timed, b.timed), statuses, mean(a.max_abs, b.max_abs, a.runs, b.runs),
                   max(a.atol or 0.0, b.atol or 0.0) or None, a.env,
                   quant_sqnr=mean(a.quant_sqnr, b.quant_sqnr, a.runs, b.runs),
                   lowering_steps=mean(a.lowering_steps, b.lowering_steps, a.runs, b.runs),
                   blocks=a.blocks + b.blocks if a.blocks and b.blocks else [])



# ---------------------------------------------------------------- findings

def modal_status(counts: dict[str, int]) -> Verdict | None:
    """The status most runs of a segment had (ties: the worse), among verdicts that say the
    target ran or failed; None when the segment has none."""
    known = [(n, Verdict(s)) for s, n in counts.items() if s in Verdict._value2member_map_]
    known = [(n, v) for n, v in known if v not in NOT_RUN]
    if not known:
        return None
    return max(known, key=lambda nv: (nv[0], -_RANK[nv[1]]))[1]


def _status_direction(before: Verdict, after: Verdict) -> str:
    if before in PASSING and after in FAILING:
        return REGRESSION
    if before in FAILING and after in PASSING:
        return IMPROVEMENT
    return CHANGED


def detect(a: Analytics, flt: HistoryFilter = HistoryFilter(), params: StepParams = StepParams()) -> list[Finding]:
    """Every status change, latency step and error growth at an environment change, once each,
    and every latency step inside an environment stretch (no recorded change: no `changes`)."""
    params.check()
    series = load_series(a, flt, params)
    envs = {r[0]: tuple(r[1:]) for r in a.sql(
        f"SELECT run_id, {', '.join(f'{f}::VARCHAR' for f in ENV_FIELDS)} FROM runs").rows}
    out: list[Finding] = []
    for s in series:
        seen = set()
        for f in _series_findings(s, envs, params):   # a change seen again (A, B, A, B...) is reported once
            key = (f.kind, f.direction, f.changes, f.after if f.kind == "status" else None,
                   None if f.changes else f.run_id)
            if key not in seen:
                seen.add(key)
                out.append(f)
    if flt.versions:
        out = [f for f in out if any(matches_version(f, v) for v in flt.versions)]
    far = dt.datetime.max
    out.sort(key=lambda f: (f.started or far, f.change, f.preset, f.kind, f.test_id, f.seed or 0))
    return out


def _series_findings(s: Series, envs: dict[str, tuple], params: StepParams) -> list[Finding]:
    found: list[Finding] = []

    def finding(kind: str, direction: str, prev: Segment, seg: Segment, before: str, after: str,
                ratio: float | None = None, lo: float | None = None, hi: float | None = None) -> None:
        changes = environment_changes(ENV_FIELDS, envs.get(prev.last_run, ()), envs.get(seg.first_run, ()))
        found.append(Finding(kind, direction, s.host, s.test_id, s.seed, s.preset, seg.first_run,
                             prev.last_run, seg.started, before, after, ratio, lo, hi, changes))

    def latency(prev: Segment, seg: Segment, st: Step) -> None:
        finding("latency", REGRESSION if st.ratio > 1 else IMPROVEMENT, prev, seg,
                f"{st.before:.4g} ms", f"{st.after:.4g} ms", st.ratio, st.ci_low, st.ci_high)

    _status_findings(s, finding)
    _metric_findings(s, params, finding)
    _int8_findings(s, finding)
    timed: list[Segment] = []
    for g in s.segments:
        if g.level is not None and g.timed > 0:
            timed += _split(g, s.within, params, latency)
    if len(timed) > 1:
        levels = np.array([g.level for g in timed], dtype=float)
        weights = np.array([g.timed for g in timed], dtype=float)
        keys = [g.env for g in timed]
        recurring = len(set(keys)) < len([e for i, e in enumerate(keys) if i == 0 or e != keys[i - 1]])
        steps = (environment_steps(keys, levels, weights, s.sigma, params) if recurring
                 else significant_steps(levels, weights, s.sigma, params))
        for st in steps:
            if timed[st.at - 1].env != timed[st.at].env:   # else a step inside a stretch: _split's
                latency(timed[st.at - 1], timed[st.at], st)
    return found


def _split(seg: Segment, sigma: float, params: StepParams, latency) -> list[Segment]:
    """A segment cut at the steps inside its stretch (each reported through `latency`, with no
    environment change), so that the fit across environments sees the levels on either side."""
    if not seg.blocks:
        return [seg]
    levels = np.array([b.level for b in seg.blocks])
    runs = np.array([b.timed for b in seg.blocks], dtype=float)
    steps = stretch_steps(levels, runs, sigma, params)
    if not steps:
        return [seg]
    bounds = [0, *[st.at for st in steps], len(seg.blocks)]
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        part = seg.blocks[lo:hi]
        timed = sum(b.timed for b in part)
        pieces.append(dataclasses.replace(
            seg, first_run=part[0].first_run, last_run=part[-1].last_run, started=part[0].started, runs=timed,
            timed=timed, level=float(np.median(levels[lo:hi])), blocks=[]))
    for i, st in enumerate(steps):
        latency(pieces[i], pieces[i + 1], st)
    return pieces


def _status_findings(s: Series, finding) -> None:
    prev, prev_status = None, None
    for seg in s.segments:
        status = seg.status
        if status is None:
            continue
        if prev is not None and prev_status is not None and status != prev_status:
            finding("status", _status_direction(prev_status, status), prev, seg, prev_status.value, status.value)
        prev, prev_status = seg, status


def _int8_findings(s: Series, finding) -> None:
    """int8 results: the quantization error (the quantizer's) and the lowering error (the
    backend's), each followed apart across environments of the same status."""
    prev: Segment | None = None
    for seg in s.segments:
        if seg.quant_sqnr is None and seg.lowering_steps is None:
            continue
        if prev is not None and prev.status == seg.status:
            qa, qb = prev.quant_sqnr, seg.quant_sqnr
            if qa is not None and qb is not None and not (math.isinf(qa) and math.isinf(qb)) \
                    and abs(qb - qa) > QUANT_SQNR_DB:
                finding("quantization", REGRESSION if qb < qa else IMPROVEMENT, prev, seg, f"{qa:.3g} dB",
                        f"{qb:.3g} dB")
            la, lb = prev.lowering_steps, seg.lowering_steps
            if la is not None and lb is not None and abs(lb - la) > LOWERING_STEPS + 1e-3:
                finding("lowering", REGRESSION if lb > la else IMPROVEMENT, prev, seg, f"{la:.3g} steps",
                        f"{lb:.3g} steps")
        prev = seg


def _metric_findings(s: Series, params: StepParams, finding) -> None:
    prev: Segment | None = None
    for seg in s.segments:
        after = seg.max_abs
        if after is None:
            continue
        if prev is not None and prev.max_abs is not None \
                and prev.status == seg.status:
            before = prev.max_abs
            atol = max(seg.atol or prev.atol or 1e-5, 1e-12)
            grew = after > params.drift_factor * max(before, atol)
            shrank = before > params.drift_factor * max(after, atol)
            if grew or shrank:
                finding("metric", REGRESSION if grew else IMPROVEMENT, prev, seg, f"{before:.3g}", f"{after:.3g}",
                        max(after, atol) / max(before, atol))
        prev = seg
