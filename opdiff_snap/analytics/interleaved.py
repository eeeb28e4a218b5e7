"""Latency of two environments compared over interleaved rounds (A, B, A, B, ...), with a
confidence interval per (test, seed, preset): what `upgrade --rounds` and `compare-envs` report.

Each round pairs a run of A with the run of B that followed it, so the machine's load drifts
little within a pair and the pairs' spread measures what is left. Per round the log ratio
l = ln(median_b / median_a) (medians over each result's repeats); over k rounds its mean m
and a t interval m +- t(k-1) s / sqrt(k), with s the standard deviation of the l's, never
below the median s of the preset's other tests nor what the repeats within the runs give (a
few rounds of one test can agree by chance; the machine's noise is the preset's). A latency
change is reported only when the whole interval lies beyond `min_ratio` (above it, or below
its inverse): an A/A comparison reports none.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from ..core.errors import OpdiffError
from .steps import repeat_se_sql
from .table import Table
from .views import Analytics

# two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)
COLUMNS = ["test_id", "seed", "preset", "rounds", "median_a", "median_b", "ratio", "ci_low", "ci_high"]


def t95(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.96 + 2.4 / df


@dataclass
class RoundsComparison:
    pairs: list[tuple[str, str]]
    all: Table              # every (test, seed, preset) timed in at least two rounds
    changes: Table          # those whose interval clears min_ratio
    min_ratio: float


def check_min_ratio(min_ratio: float) -> None:
    if min_ratio < 1:
        raise OpdiffError(f"--min-ratio must be at least 1 (a ratio); got {min_ratio}. Nothing was run.")


def compare_rounds(an: Analytics, pairs: list[tuple[str, str]], min_ratio: float = 1.1) -> RoundsComparison:
    """Per (test, seed, preset) timed in at least two rounds: the geometric means of the medians,
    the ratio B / A and its 95 % interval; `changes` keeps those whose interval clears min_ratio."""
    if len(pairs) < 2:
        raise OpdiffError(f"a comparison over rounds needs at least 2 rounds; got {len(pairs)}.")
    check_min_ratio(min_ratio)
    t = an.sql(f"""
        WITH p AS (SELECT unnest($1::VARCHAR[]) AS run_a, unnest($2::VARCHAR[]) AS run_b),
        x AS (
          SELECT ra.test_id, ra.seed, ra.preset,
                 coalesce(list_median(ra.infer_ms_all), ra.infer_ms) AS ma,
                 coalesce(list_median(rb.infer_ms_all), rb.infer_ms) AS mb,
                 sqrt(coalesce(({repeat_se_sql('ra')}) ^ 2, 0) + coalesce(({repeat_se_sql('rb')}) ^ 2, 0)) AS se
          FROM p JOIN results ra ON ra.run_id = p.run_a
                 JOIN results rb ON rb.run_id = p.run_b AND rb.test_id = ra.test_id
                      AND rb.seed IS NOT DISTINCT FROM ra.seed AND rb.preset = ra.preset)
        SELECT test_id, seed, preset, count(*) AS rounds, exp(avg(ln(ma))) AS ga, exp(avg(ln(mb))) AS gb,
               avg(ln(mb / ma)) AS m, coalesce(stddev_samp(ln(mb / ma)), 0) AS s, median(se) AS se
        FROM x WHERE ma > 0 AND mb > 0
        GROUP BY ALL HAVING count(*) >= 2 ORDER BY ALL""",
               [[a for a, _ in pairs], [b for _, b in pairs]])
    spread: dict[str, list[float]] = {}
    for row in t.rows:
        spread.setdefault(row[2], []).append(row[7])
    typical = {preset: statistics.median(v) for preset, v in spread.items()}
    rows, changes = [], []
    for test_id, seed, preset, k, ga, gb, m, s, se in t.rows:
        half = t95(k - 1) * max(s, typical[preset], se or 0.0) / math.sqrt(k)
        row = (test_id, seed, preset, k, ga, gb, math.exp(m), math.exp(m - half), math.exp(m + half))
        rows.append(row)
        if row[7] > min_ratio or row[8] < 1 / min_ratio:
            changes.append(row)
    changes.sort(key=lambda r: -r[6])
    return RoundsComparison(list(pairs), Table(list(COLUMNS), rows), Table(list(COLUMNS), changes), min_ratio)
