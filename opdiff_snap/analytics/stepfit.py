"""The piecewise-constant fit behind `opdiff regressions` (docs/analytics.md, "Method"): levels
of ln(latency) cut into constant pieces by optimal partitioning, each step kept only while it
clears the noise; the noise bound of a series measured on few runs; and the fit inside one
environment stretch, where no recorded change explains a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import OpdiffError

MAD = 1.4826                      # MAD -> standard deviation for normal noise
MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median over that of a mean
# 5 % quantiles of chi-square with 1 to 5 degrees of freedom (Wilson-Hilferty beyond)
_CHI2_05 = (0.003932, 0.1026, 0.3518, 0.7107, 1.1455)


@dataclass(frozen=True)
class StepParams:
    """The detector's knobs (docs/analytics.md lists them with their defaults)."""

    penalty: float | None = None   # per step, in noise variances; None: 3 ln(runs in the series)
    min_ratio: float = 1.1         # a step's confidence interval must clear this ratio
    noise_k: float = 2.0           # and the step must exceed noise_k x the run-to-run noise
    z: float = 3.0                 # width of the confidence interval, in standard errors
    drift_factor: float = 10.0     # max_abs growth that counts (x max(before, atol))
    noise_floor: float = 0.02      # sigma never below this (2 %)
    min_pool: int = 6              # degrees of freedom (runs - environments) a series needs for its own noise
    min_runs: int = 3              # runs on either side of a step with no environment change

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
        if self.min_runs < 2:
            raise OpdiffError(f"--min-runs must be at least 2 (a run alone is no level); got {self.min_runs}.")


def noise_bound(sd: float, df: int) -> float:
    """An upper 95 % bound on a standard deviation `sd` measured with `df` degrees of freedom:
    what a series of few runs per environment may assume of its noise (never less than it
    saw, much more when it saw little)."""
    if df <= len(_CHI2_05):
        q = _CHI2_05[df - 1]
    else:
        q = df * (1 - 2 / (9 * df) - 1.645 * math.sqrt(2 / (9 * df))) ** 3
    return sd * math.sqrt(df / q)


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
    at: int                 # index of the first level after the step
    ratio: float
    ci_low: float
    ci_high: float
    before: float           # level before / after, ms
    after: float


def _step(at: int, m0: float, w0: float, m1: float, w1: float, var: float, sigma: float,
          params: StepParams) -> tuple[Step, float]:
    """The step from level m0 (weight w0) to m1, and its margin: > 0 when it is significant."""
    delta, se = m1 - m0, math.sqrt(var * (1 / w0 + 1 / w1))
    margin = min(abs(delta) - params.noise_k * sigma,
                 abs(delta) - params.z * se - max(math.log(params.min_ratio), 0.0))
    return Step(at, math.exp(delta), math.exp(delta - params.z * se), math.exp(delta + params.z * se),
                math.exp(m0), math.exp(m1)), margin


def variance(sigma: float) -> float:
    """The variance of the median ln(latency) of a run whose run-to-run noise is sigma."""
    return (MEDIAN_SE * sigma) ** 2


def _penalty(params: StepParams, total: float) -> float:
    return params.penalty if params.penalty is not None else 3 * math.log(max(total, 3.0))


def _pruned(cuts: list[int], n: int, judge) -> list[Step]:
    """The least significant of `cuts` dropped while one is not significant; `judge(bounds, i)`:
    the step at cut i between the pieces bounds[i]:bounds[i + 1] and bounds[i + 1]:bounds[i + 2],
    and its margin (> 0: significant)."""
    while cuts:
        bounds = [0, *cuts, n]
        found = [judge(bounds, i) for i in range(len(cuts))]
        worst = int(np.argmin([margin for _, margin in found]))
        if found[worst][1] > 0:
            return [step for step, _ in found]
        del cuts[worst]
    return []


def significant_steps(levels: np.ndarray, weights: np.ndarray, sigma: float, params: StepParams) -> list[Step]:
    """fit_steps, then the least significant step dropped while one is below the noise."""
    if float(levels.max() - levels.min()) <= params.noise_k * sigma:
        return []     # no two pieces can differ by more than the levels' range: nothing to fit
    var = variance(sigma)

    def judge(bounds: list[int], i: int) -> tuple[Step, float]:
        a, b, c = bounds[i:i + 3]
        return _step(b, float(np.average(levels[a:b], weights=weights[a:b])), float(weights[a:b].sum()),
                     float(np.average(levels[b:c], weights=weights[b:c])), float(weights[b:c].sum()), var, sigma,
                     params)

    return _pruned(fit_steps(levels, weights, var, _penalty(params, float(weights.sum()))), len(levels), judge)


def _per_run(runs: np.ndarray) -> float:
    """What the noise of a block's level is, over the run-to-run noise: a run's level is its
    own; a median over b runs has sqrt(pi / 2) / sqrt(b) of it."""
    per_block = float(runs.mean())
    return MEDIAN_SE / math.sqrt(per_block) if per_block > 1 else 1.0


def stretch_noise(stretches: list[tuple[np.ndarray, np.ndarray]]) -> float | None:
    """The run-to-run noise of ln(latency) inside environment stretches, from the successive
    differences of their block levels (`stretches`: (levels, runs per block) each): a step
    moves one difference only, so it cannot hide itself. None: no two blocks."""
    d = [np.abs(np.diff(levels)) / _per_run(runs) for levels, runs in stretches if len(levels) > 1]
    if not d:
        return None
    return MAD * float(np.median(np.concatenate(d))) / math.sqrt(2)


def stretch_steps(levels: np.ndarray, runs: np.ndarray, sigma: float, params: StepParams) -> list[Step]:
    """Steps inside one environment stretch, over its blocks of runs (`levels`: their median
    ln(latency), `runs`: how many runs each holds), `sigma` the run-to-run noise there
    (stretch_noise, or more). Nothing recorded says a change happened, so a step must be
    sustained and stand out of the runs around it: `min_runs` runs and two blocks on either side, the
    pieces' medians compared (one outlying run moves no median), and the noise never below
    the spread within either piece (two outliers among three runs are no step)."""
    if len(levels) < 4 or int(runs.sum()) < 2 * params.min_runs \
            or float(levels.max() - levels.min()) <= params.noise_k * sigma:
        return []
    scale = _per_run(runs)
    if not _may_step(levels, sigma * scale, params):
        return []

    def judge(bounds: list[int], i: int) -> tuple[Step, float]:
        a, b, c = bounds[i:i + 3]
        m0, m1 = float(np.median(levels[a:b])), float(np.median(levels[b:c]))
        spread = max(math.sqrt(float(np.sum((levels[lo:hi] - m) ** 2)) / max(hi - lo - 1, 1))
                     for lo, hi, m in ((a, b, m0), (b, c, m1)))
        noise = max(sigma, spread / scale)
        step, margin = _step(b, m0, b - a, m1, c - b, variance(noise * scale), noise, params)
        sustained = min(runs[a:b].sum(), runs[b:c].sum()) >= params.min_runs and min(b - a, c - b) >= 2
        return step, margin if sustained else -math.inf

    cuts = fit_steps(levels, np.ones(len(levels)), variance(sigma * scale), _penalty(params, len(levels)))
    return _pruned(cuts, len(levels), judge)


def _may_step(levels: np.ndarray, block: float, params: StepParams) -> bool:
    """Whether any split into two pieces of two levels or more has means that clear the
    confidence rule with the standard error of a mean (smaller than a median's, so a stretch
    this passes over holds no step the fit would keep): most stretches of noise end here."""
    n = len(levels)
    k = np.arange(2, n - 1)
    if not len(k):
        return False
    c = np.cumsum(levels)
    delta = np.abs((c[-1] - c[k - 1]) / (n - k) - c[k - 1] / k)
    se = block * np.sqrt(1 / k + 1 / (n - k))
    return bool(np.any(delta - params.z * se - max(math.log(params.min_ratio), 0.0) > 0))


def environment_steps(envs: list, levels: np.ndarray, weights: np.ndarray, sigma: float,
                      params: StepParams) -> list[Step]:
    """For a series whose environments recur (A, B, A, B...: interleaved rounds, a rollback):
    each environment's runs pooled, and each change X -> Y compared once, where it first happens."""
    pooled: dict[object, tuple[float, float]] = {}
    for env, level, w in zip(envs, levels, weights):
        w0, wy = pooled.get(env, (0.0, 0.0))
        pooled[env] = (w0 + float(w), wy + float(w) * float(level))
    var, seen, out = variance(sigma), set(), []
    for i in range(1, len(envs)):
        x, y = envs[i - 1], envs[i]
        if x == y or (x, y) in seen or (y, x) in seen:
            continue
        seen.add((x, y))
        (wx, sx), (wy, sy) = pooled[x], pooled[y]
        step, margin = _step(i, sx / wx, wx, sy / wy, wy, var, sigma, params)
        if margin > 0:
            out.append(step)
    return out
