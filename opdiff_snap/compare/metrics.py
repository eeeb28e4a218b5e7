"""The metrics of one comparison, as the history keeps them: plain numbers, no torch,
so the history's readers (DuckDB views, reports) import them without a backend.

A result's metrics are its comparison's numbers and, beside them, what judging it also
measured: the precision control (`control`), a pair's side b against side a on the target
(`b_vs_a`) and the recomputed gradients against the recorded ones (`grad`). In the JSON
they are nested objects after the numbers; the DuckDB views read the numbers only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from ..core.trees import json_safe

NONFINITE = ("nan", "inf", "-inf")   # how json_safe writes non-finite floats


@dataclass
class OutputStats:
    """The statistics of one compared floating output (`output`: its path, `out[1]`), as
    the result's top-level numbers give them over every output together."""

    output: str
    numel: int = 0
    max_abs: float = 0.0
    min_atol: float = 0.0
    min_rtol: float = 0.0
    sqnr: float | None = None
    mean_dev: float = 0.0
    rel_l2: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {f.name: json_safe(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "OutputStats":
        return cls(**{f.name: _number(data[f.name]) for f in fields(cls) if f.name in data})


def sqnr_db(noise: float, power: float) -> float | None:
    """10 log10(power / noise): inf when equal, -inf for a zero signal, None when both are 0."""
    if noise == 0.0 and power == 0.0:
        return None
    return math.inf if noise == 0.0 else -math.inf if power == 0.0 else 10.0 * math.log10(power / noise)


def rel_l2(noise: float, power: float) -> float:
    """sqrt(noise / power), the relative L2 error: 0 when equal, inf for a zero signal."""
    return 0.0 if noise == 0.0 else math.inf if power == 0.0 else math.sqrt(noise / power)


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
    normwise or bias; `allowance` is what the worst element was allowed.

    On an fp16/bf16 target with the precision control, `torch_multiple` is the largest,
    over the composite outputs, of the target's error against the float64 reference as a
    multiple of torch eager's own error at that precision (RMS and largest error, the
    larger ratio), and `torch_factor` the multiple allowed; `as_torch` counts the elements
    outside every band of outputs forgiven for being within it.

    The statistics people compare backends by, over the same entries: `min_atol` is the
    smallest atol with which every element passes at the test's rtol, `min_rtol` the
    smallest rtol at its atol (inf where an element beyond atol expects 0); `sqnr` is
    10 log10(sum expected^2 / sum (actual - expected)^2) in dB (inf: equal; None: both
    sums zero), `mean_dev` the mean signed deviation (actual - expected), `rel_l2` the
    relative L2 error ||actual - expected|| / ||expected||.

    On an int8 preset (compare/int8_errors.py): `quant_sqnr` is the quantized reference's
    SQNR (dB) against the golden, the quantization error; `lowering_sqnr` the backend's
    against the quantized reference; `lowering_steps` its largest error there, and
    `lowering_bias` its largest mean signed error on an output, in quantization steps;
    `quant_step` the step of the output with the largest error; `quant_failed` which
    error failed the result (lowering, quantization).

    `compared` is False for the metrics of a result whose outputs could not be compared
    (a structure mismatch, an int8 result converted but not run) but that keeps what was
    measured beside them: there, only the int8 numbers that were measured are written."""

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
    min_rtol: float = 0.0
    sqnr: float | None = None
    mean_dev: float = 0.0
    rel_l2: float = 0.0
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
    torch_multiple: float | None = None
    torch_factor: float | None = None
    as_torch: int = 0
    quant_sqnr: float | None = None
    lowering_sqnr: float | None = None
    lowering_steps: float | None = None
    lowering_bias: float | None = None
    quant_step: float | None = None
    quant_failed: str | None = None
    # the statistics above for each floating output on its own, in output order
    outputs: list[OutputStats] = field(default_factory=list)

    # measured beside the comparison when judging asked for it; in the JSON after the numbers
    control: Control | None = field(default=None, metadata={"beside": True})
    b_vs_a: Judged | None = field(default=None, metadata={"beside": True})
    grad: Judged | None = field(default=None, metadata={"beside": True})
    compared: bool = field(default=True, metadata={"beside": True})

    def to_json(self) -> dict[str, Any]:
        if self.compared:
            out = {k: json_safe(getattr(self, k)) for k in NUMBERS if k != "outputs"}
            out["outputs"] = [o.to_json() for o in self.outputs]
        else:   # the numbers of no comparison would read as one: only the int8 ones measured
            out = {k: json_safe(getattr(self, k)) for k in QUANT_NUMBERS if getattr(self, k) is not None}
        for name in ("control", "b_vs_a", "grad"):
            part = getattr(self, name)
            if part is not None:
                out[name] = part.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Metrics":
        """The inverse of to_json. A number missing (a line written before it existed)
        takes its default, and keys this version does not know are left out."""
        values: dict[str, Any] = {k: _number(data[k]) for k in NUMBERS if k in data and k != "outputs"}
        if isinstance(data.get("outputs"), list):
            values["outputs"] = [OutputStats.from_json(o) for o in data["outputs"] if isinstance(o, Mapping)]
        if isinstance(values.get("worst_index"), list):
            values["worst_index"] = tuple(values["worst_index"])
        for k in ("worst_expected", "worst_actual"):   # kept as written: "nan" is a value here
            if k in data:
                values[k] = data[k]
        control, b_vs_a, grad = (data.get(k) for k in ("control", "b_vs_a", "grad"))
        return cls(**values, compared=any(k not in QUANT_NUMBERS for k in values),
                   control=Control.from_json(control) if isinstance(control, Mapping) else None,
                   b_vs_a=Judged.from_json(b_vs_a) if isinstance(b_vs_a, Mapping) else None,
                   grad=Judged.from_json(grad) if isinstance(grad, Mapping) else None)


@dataclass
class Control:
    """The precision control of a MISMATCH on fp16/bf16: torch eager at the same
    precision, judged the same way (docs/check.md, "Precision-limited")."""

    verdict: str
    max_abs: float
    failed_bound: str | None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "max_abs": self.max_abs, "failed_bound": self.failed_bound}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Control":
        return cls(str(data.get("verdict")), _number(data.get("max_abs", 0.0)), data.get("failed_bound"))


@dataclass
class Judged:
    """A comparison kept beside a result's own: its verdict and its metrics (None when
    it had none)."""

    verdict: str
    metrics: Metrics | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, **(self.metrics.to_json() if self.metrics is not None else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Judged":
        rest = {k: v for k, v in data.items() if k != "verdict"}
        metrics = Metrics.from_json(rest)
        return cls(str(data.get("verdict")), metrics if metrics.compared else None)


NUMBERS = tuple(f.name for f in fields(Metrics) if not f.metadata.get("beside"))
"""The comparison's numbers: the metric columns of the history's views."""
QUANT_NUMBERS = frozenset(k for k in NUMBERS if k.startswith(("quant_", "lowering_")))


def _number(value: Any) -> Any:
    """A value as to_json wrote it, with the strings of non-finite floats as floats."""
    return float(value) if isinstance(value, str) and value in NONFINITE else value
