"""The metrics of one comparison, as the history keeps them: plain numbers, no torch,
so the history's readers (DuckDB views, reports) import them without a backend."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ..core.trees import json_safe


@dataclass
class Metrics:
    """Over all compared tensor leaves together. Means, max_abs, max_rel and cosine use
    the entries finite on both sides (non-finite disagreements are counted in
    `mismatched`); max_rel leaves out entries whose expected value is 0. Complex leaves
    count one element per complex number and compare real and imaginary parts.

    With a float64 reference: `baseline_error` is the largest |golden - reference| over
    the outputs (the baseline's own rounding error), `error_bound` the largest rounding
    allowance used, and `within_rounding` how many elements failed the configured
    tolerance but passed by that allowance or against the reference itself.

    `bias` is the mean of (actual - expected), against the exact answer where the
    elementwise bound holds, over the output whose bias is the largest share of its bound
    `bias_bound`; `drift` the mean error in target ulps there, with `drift_bound`.
    `elementwise_ulps` is the largest error in target ulps against the float64 result on
    target-rounded inputs (a single elementwise op on fp16/bf16). `failed_bound` names the
    bound a MISMATCH broke first: nonfinite, exact, elementwise,
    normwise or bias; `allowance` is what the worst element was allowed."""

    max_abs: float = 0.0
    mean_abs: float = 0.0
    mse: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    mismatched: int = 0
    mismatched_frac: float = 0.0
    numel: int = 0
    max_expected: float = 0.0
    worst_index: tuple[int, ...] | None = None
    worst_output: str | None = None
    worst_expected: float | str | None = None
    worst_actual: float | str | None = None
    min_atol: float = 0.0
    baseline_error: float | None = None
    error_bound: float | None = None
    within_rounding: int = 0
    bias: float | None = None
    bias_bound: float | None = None
    drift: float | None = None
    drift_bound: float | None = None
    elementwise_ulps: float | None = None
    failed_bound: str | None = None
    allowance: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: json_safe(v) for k, v in asdict(self).items()}

    # Mapping-style access, so dict(metrics) and metrics["max_abs"] work.
    def keys(self) -> list[str]:
        return [f.name for f in fields(self)]

    def __getitem__(self, key: str) -> Any:
        return self.to_json()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_json().get(key, default)
