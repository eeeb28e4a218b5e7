"""Steps in each (host, test, seed, preset) history, attributed to the environment change
between the runs on either side (docs/analytics.md, "Regressions across the history").

1. DuckDB orders each series' check runs by start time and cuts it into environment
   segments: maximal stretches of consecutive runs with the same versions and machine
   (ENV_FIELDS). Only a segment boundary can carry a step: a change between two runs of
   one environment is the machine's load, not the environment.
2. DuckDB reduces every segment to a few numbers (runs, median log latency, status counts,
   median max_abs) and every series to its noise: sigma of log latency from the successive
   differences between runs of the same environment (1.4826 median|d| / sqrt 2, robust to
   the steps themselves), never below the standard error the repeats within a run give.
   A series with few runs per environment takes the noise of its (host, preset).
3. Per series with more than one segment, numpy fits piecewise-constant levels over the
   segments (optimal partitioning of weighted least squares on segment medians, a penalty
   per step in units of the noise variance), then drops the least significant step while
   one is smaller than `noise_k` sigma, or its confidence interval does not clear
   `min_ratio`. Status and max_abs changes compare the segments on either side.

The heavy work (1M results -> a row per segment) is one SQL statement; the fit sees only
series that changed environment.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import OpdiffError
from ..core.verdicts import FAILING, NOT_RUN, PASSING, PRECEDENCE, Verdict
from .findings import CHANGED, IMPROVEMENT, REGRESSION, Finding, environment_changes, matches_version
from .ingest import LIBS
from .views import Analytics

ENV_FIELDS = (*LIBS, "os_version", "cpu_model", "machine", "threads")
_MAD = 1.4826                      # MAD -> standard deviation for normal noise
_MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median over that of a mean


@dataclass(frozen=True)
class StepParams:
    """The detector's knobs (docs/analytics.md lists them with their defaults)."""

    penalty: float | None = None   # per step, in noise variances; None: 3 ln(runs in the series)
    min_ratio: float = 1.1         # a step's confidence interval must clear this ratio
    noise_k: float = 2.0           # and the step must exceed noise_k x the run-to-run noise
    z: float = 3.0                 # width of the confidence interval, in standard errors
    drift_factor: float = 10.0     # max_abs growth that counts (x max(before, atol))
    noise_floor: float = 0.02      # sigma never below this (2 %)
    min_pool: int = 4              # differences a series needs to use its own noise

    def check(self) -> None:
        for name in ("min_ratio", "drift_factor"):
            if getattr(self, name) < 1:
                raise OpdiffError(f"--{name.replace('_', '-')} must be at least 1 (a ratio); "
                                  f"got {getattr(self, name)}.")
        for name in ("noise_k", "z", "noise_floor"):
            if getattr(self, name) < 0:
                raise OpdiffError(f"--{name.replace('_', '-')} must not be negative; got {getattr(self, name)}.")
        if self.penalty is not None and self.penalty < 0:
            raise OpdiffError(f"--penalty must not be negative; got {self.penalty}.")


@dataclass(frozen=True)
class HistoryFilter:
    """Which part of the history to look at."""

    presets: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()          # globs over test ids
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    versions: tuple[str, ...] = ()       # findings whose change involves one of these (findings.matches_version)
    hosts: tuple[str, ...] = ()


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


@dataclass
class Series:
    host: str | None
    test_id: str
    seed: int | None
    preset: str
    sigma: float
    segments: list[Segment] = field(default_factory=list)


def _where(flt: HistoryFilter) -> tuple[str, list]:
    conds: list[str] = []
    params: list = []
    if flt.presets:
        conds.append("list_contains(?::VARCHAR[], r.preset)")
        params.append(list(flt.presets))
    if flt.tests:
        conds.append("(" + " OR ".join("r.test_id GLOB ?" for _ in flt.tests) + ")")
        params += list(flt.tests)
    if flt.hosts:
        conds.append("list_contains(?::VARCHAR[], runs.host)")
        params.append(list(flt.hosts))
    if flt.since is not None:
        conds.append("runs.started >= ?")
        params.append(flt.since)
    if flt.until is not None:
        conds.append("runs.started <= ?")
        params.append(flt.until)
    return " AND ".join(conds) or "true", params


def _sql(where: str) -> str:
    env = "[" + ", ".join(f"runs.{f}::VARCHAR" for f in ENV_FIELDS) + "]"
    key = "host, test_id, seed, preset"
    return f"""
WITH x AS (
  SELECT runs.host, r.test_id, r.seed, r.preset, r.run_id, runs.started, {env} AS env, r.status,
         CASE WHEN r.infer_ms > 0 THEN ln(r.infer_ms) END AS lt,
         CASE WHEN len(r.infer_ms_all) >= 3 AND list_min(r.infer_ms_all) > 0
              THEN {_MAD * _MEDIAN_SE} * list_aggregate(list_transform(r.infer_ms_all, lambda v: ln(v)), 'mad')
                   / sqrt(len(r.infer_ms_all)) END AS rep,
         r.max_abs, r.atol
  FROM results r JOIN runs USING (run_id)
  WHERE coalesce(runs.command, 'check') = 'check' AND r.test_id IS NOT NULL AND r.preset IS NOT NULL
        AND {where}),
y AS (
  SELECT *, (env IS DISTINCT FROM lag(env) OVER w)::INTEGER AS brk,
         abs(lt - lag(lt) OVER w) AS d
  FROM x WINDOW w AS (PARTITION BY {key} ORDER BY started, run_id)),
z AS MATERIALIZED (
  SELECT *, sum(brk) OVER (PARTITION BY {key} ORDER BY started, run_id ROWS UNBOUNDED PRECEDING) AS seg
  FROM y),
ser AS (
  SELECT {key}, max(seg) AS segs,
         median(d) FILTER (WHERE brk = 0) AS d_same, count(d) FILTER (WHERE brk = 0) AS n_same,
         median(d) AS d_all, count(d) AS n_all, median(rep) AS rep
  FROM z GROUP BY ALL)
SELECT ser.*, s.seg, s.first_run, s.last_run, s.started, s.runs, s.timed, s.level, s.statuses,
       s.max_abs, s.atol
FROM ser LEFT JOIN (
  SELECT z.host, z.test_id, z.seed, z.preset, seg, arg_min(run_id, (started, run_id)) AS first_run,
         arg_max(run_id, (started, run_id)) AS last_run, min(started) AS started,
         count(*) AS runs, count(lt) AS timed, median(lt) AS level,
         histogram(status) FILTER (WHERE status IS NOT NULL) AS statuses,
         median(max_abs) AS max_abs, max(atol) AS atol
  FROM z SEMI JOIN (SELECT {key} FROM ser WHERE segs > 1) m
       ON z.host IS NOT DISTINCT FROM m.host AND z.test_id = m.test_id
          AND z.seed IS NOT DISTINCT FROM m.seed AND z.preset = m.preset
  GROUP BY ALL) s
  ON s.host IS NOT DISTINCT FROM ser.host AND s.test_id = ser.test_id
     AND s.seed IS NOT DISTINCT FROM ser.seed AND s.preset = ser.preset
ORDER BY ser.host NULLS FIRST, ser.test_id, ser.seed NULLS FIRST, ser.preset, s.seg
"""


def load_series(a: Analytics, flt: HistoryFilter, params: StepParams) -> list[Series]:
    """Every series that changed environment, with its segments and noise (one SQL statement)."""
    where, args = _where(flt)
    t = a.sql(_sql(where), args)
    c = {name: i for i, name in enumerate(t.columns)}
    # the noise of each (host, preset): the median over its series with enough differences
    pooled: dict[tuple, list[float]] = {}
    for row in t.rows:
        if row[c["n_same"]] >= params.min_pool and row[c["d_same"]] is not None:
            pooled.setdefault((row[c["host"]], row[c["preset"]]), []).append(row[c["d_same"]])
    pool = {k: float(np.median(v)) for k, v in pooled.items()}
    out: list[Series] = []
    current: Series | None = None
    for row in t.rows:
        if row[c["segs"]] <= 1 or row[c["seg"]] is None:
            continue
        ident = (row[c["host"]], row[c["test_id"]], row[c["seed"]], row[c["preset"]])
        if current is None or (current.host, current.test_id, current.seed, current.preset) != ident:
            d = _diff_noise(row, c, pool.get((ident[0], ident[3])), params.min_pool)
            sigma = max(d * _MAD / math.sqrt(2), row[c["rep"]] or 0.0, params.noise_floor)
            current = Series(*ident, sigma=sigma)
            out.append(current)
        current.segments.append(Segment(
            row[c["first_run"]], row[c["last_run"]], row[c["started"]], row[c["runs"]], row[c["timed"]],
            row[c["level"]], dict(row[c["statuses"]] or {}), row[c["max_abs"]], row[c["atol"]]))
    return out


def _diff_noise(row, c, pooled: float | None, min_pool: int) -> float:
    """median |successive difference| of log latency: within one environment if the series has
    enough such pairs, else its (host, preset)'s, else over all its pairs (steps included)."""
    if row[c["n_same"]] >= min_pool:
        return row[c["d_same"]]
    if pooled is not None:
        return pooled
    if row[c["n_all"]] >= min_pool or row[c["d_same"]] is None:
        return row[c["d_all"]] or 0.0
    return row[c["d_same"]]


# ---------------------------------------------------------------- the fit

def fit_steps(levels: np.ndarray, weights: np.ndarray, var: float, penalty: float) -> list[int]:
    """Optimal partitioning of `levels` (weighted least squares, `penalty` per step, costs in
    units of `var`): the indices where a new constant piece starts (0 excluded)."""
    n = len(levels)
    cw = np.concatenate([[0.0], np.cumsum(weights)])
    cy = np.concatenate([[0.0], np.cumsum(weights * levels)])
    cy2 = np.concatenate([[0.0], np.cumsum(weights * levels ** 2)])
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    start = np.zeros(n + 1, dtype=int)
    for t in range(1, n + 1):
        s = np.arange(t)
        w, wy, wy2 = cw[t] - cw[s], cy[t] - cy[s], cy2[t] - cy2[s]
        cost = best[s] + (wy2 - wy ** 2 / w) / var + penalty
        k = int(np.argmin(cost))
        best[t], start[t] = cost[k], k
    cuts, t = [], n
    while t > 0:
        t = int(start[t])
        if t > 0:
            cuts.append(t)
    return sorted(cuts)


@dataclass
class Step:
    at: int                 # index of the first segment after the step
    ratio: float
    ci_low: float
    ci_high: float
    before: float           # level before / after, ms
    after: float


def significant_steps(levels: np.ndarray, weights: np.ndarray, sigma: float, params: StepParams) -> list[Step]:
    """fit_steps, then the least significant step dropped while one is below the noise."""
    var = (_MEDIAN_SE * sigma) ** 2
    total = float(weights.sum())
    penalty = params.penalty if params.penalty is not None else 3 * math.log(max(total, 3.0))
    cuts = fit_steps(levels, weights, var, penalty)
    floor = max(math.log(params.min_ratio), 0.0)
    while cuts:
        bounds = [0, *cuts, len(levels)]
        pieces = [(float(weights[a:b].sum()), float(np.average(levels[a:b], weights=weights[a:b])))
                  for a, b in zip(bounds, bounds[1:])]
        steps, margins = [], []
        for i, cut in enumerate(cuts):
            (w0, m0), (w1, m1) = pieces[i], pieces[i + 1]
            delta, se = m1 - m0, math.sqrt(var * (1 / w0 + 1 / w1))
            margin = min(abs(delta) - params.noise_k * sigma, abs(delta) - params.z * se - floor)
            steps.append(Step(cut, math.exp(delta), math.exp(delta - params.z * se), math.exp(delta + params.z * se),
                              math.exp(m0), math.exp(m1)))
            margins.append(margin)
        worst = int(np.argmin(margins))
        if margins[worst] > 0:
            return steps
        del cuts[worst]
    return []


# ---------------------------------------------------------------- findings

def _modal_status(counts: dict[str, int]) -> Verdict | None:
    """The status most runs of a segment had (ties: the worse), among verdicts that say the
    target ran or failed; None when the segment has none."""
    rank = {v: i for i, v in enumerate(PRECEDENCE)}
    known = [(n, Verdict(s)) for s, n in counts.items() if s in Verdict._value2member_map_]
    known = [(n, v) for n, v in known if v not in NOT_RUN]
    if not known:
        return None
    return max(known, key=lambda nv: (nv[0], -rank[nv[1]]))[1]


def _status_direction(before: Verdict, after: Verdict) -> str:
    if before in PASSING and after in FAILING:
        return REGRESSION
    if before in FAILING and after in PASSING:
        return IMPROVEMENT
    return CHANGED


def detect(a: Analytics, flt: HistoryFilter = HistoryFilter(), params: StepParams = StepParams()) -> list[Finding]:
    """Every status change, latency step and error growth at an environment change, once each."""
    params.check()
    series = load_series(a, flt, params)
    envs = {r[0]: tuple(r[1:]) for r in a.sql(
        f"SELECT run_id, {', '.join(f'{f}::VARCHAR' for f in ENV_FIELDS)} FROM runs").rows}
    out: list[Finding] = []
    for s in series:
        seen = set()
        for f in _series_findings(s, envs, params):   # a change seen again (A, B, A, B...) is reported once
            key = (f.kind, f.direction, f.changes, f.after if f.kind == "status" else None)
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

    _status_findings(s, finding)
    _metric_findings(s, params, finding)
    timed = [g for g in s.segments if g.level is not None and g.timed > 0]
    if len(timed) > 1:
        levels = np.array([g.level for g in timed], dtype=float)
        weights = np.array([g.timed for g in timed], dtype=float)
        for st in significant_steps(levels, weights, s.sigma, params):
            finding("latency", REGRESSION if st.ratio > 1 else IMPROVEMENT, timed[st.at - 1], timed[st.at],
                    f"{st.before:.4g} ms", f"{st.after:.4g} ms", st.ratio, st.ci_low, st.ci_high)
    return found


def _status_findings(s: Series, finding) -> None:
    prev, prev_status = None, None
    for seg in s.segments:
        status = _modal_status(seg.statuses)
        if status is None:
            continue
        if prev is not None and prev_status is not None and status != prev_status:
            finding("status", _status_direction(prev_status, status), prev, seg, prev_status.value, status.value)
        prev, prev_status = seg, status


def _metric_findings(s: Series, params: StepParams, finding) -> None:
    prev: Segment | None = None
    for seg in s.segments:
        after = seg.max_abs
        if after is None:
            continue
        if prev is not None and prev.max_abs is not None \
                and _modal_status(prev.statuses) == _modal_status(seg.statuses):
            before = prev.max_abs
            atol = max(seg.atol or prev.atol or 1e-5, 1e-12)
            grew = after > params.drift_factor * max(before, atol)
            shrank = before > params.drift_factor * max(after, atol)
            if grew or shrank:
                finding("metric", REGRESSION if grew else IMPROVEMENT, prev, seg, f"{before:.3g}", f"{after:.3g}",
                        max(after, atol) / max(before, atol))
        prev = seg
