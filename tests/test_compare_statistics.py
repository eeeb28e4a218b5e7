"""The statistics every comparison reports (SQNR, mean signed deviation, relative L2 error,
the smallest atol and rtol that would have passed) against a float64 computation written
out here, on hand-made arrays with zeros, infinities and NaN; and that they reach the
history's columns and a MISMATCH's message."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from opdiff_snap.compare.metrics import Metrics
from opdiff_snap.compare.numerics import compare
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite.model import Tolerance


def _by_hand(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float) -> dict[str, float | None]:
    """The same statistics in float64, over the elements finite on both sides."""
    e, a = expected.astype(np.float64).ravel(), actual.astype(np.float64).ravel()
    keep = np.isfinite(e) & np.isfinite(a)
    e, a = e[keep], a[keep]
    d = a - e
    power, noise = float((e * e).sum()), float((d * d).sum())
    sqnr = None if power == noise == 0 else math.inf if noise == 0 else 10 * math.log10(power / noise)
    over = np.abs(d) > atol
    if not over.any():
        min_rtol = 0.0
    elif (np.abs(e[over]) == 0).any():
        min_rtol = math.inf
    else:
        min_rtol = float(((np.abs(d[over]) - atol) / np.abs(e[over])).max())
    return {"sqnr": sqnr, "mean_dev": float(d.mean()), "rel_l2": math.sqrt(noise / power) if power else math.inf,
            "min_atol": float((np.abs(d) - rtol * np.abs(e)).clip(min=0).max()), "min_rtol": min_rtol}


CASES = {
    "plain": ([1.0, -2.0, 3.0, 4.0, -5.0, 0.5], [1.01, -2.0, 2.97, 4.0, -5.05, 0.5]),
    "with zeros": ([0.0, 1.0, 0.0, -2.0, 3.0, 0.0], [0.0, 1.002, 0.0, -2.0, 3.01, 0.0]),
    "with inf and nan where both agree": ([math.inf, 1.0, math.nan, -math.inf, 2.0, 0.25],
                                          [math.inf, 1.1, math.nan, -math.inf, 1.9, 0.25]),
    "one-sided bias": ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.001, 2.001, 3.001, 4.001, 5.001, 6.001]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_statistics_agree_with_a_float64_computation(name):
    expected, actual = (np.asarray(v, dtype=np.float32) for v in CASES[name])
    tol = Tolerance(1e-4, 1e-3, baseline_factor=0.0)
    m = compare(torch.from_numpy(expected), torch.from_numpy(actual), tol).metrics
    assert m is not None
    want = _by_hand(expected, actual, 1e-4, 1e-3)
    assert m.sqnr == pytest.approx(want["sqnr"], rel=1e-9)
    assert m.mean_dev == pytest.approx(want["mean_dev"], rel=1e-9, abs=1e-15)
    assert m.rel_l2 == pytest.approx(want["rel_l2"], rel=1e-9)
    assert m.min_atol == pytest.approx(want["min_atol"], rel=1e-9, abs=1e-15)
    assert m.min_rtol == pytest.approx(want["min_rtol"], rel=1e-9)
    # the smallest tolerances are exactly that: each passes, and a hair less does not
    if m.min_rtol and math.isfinite(m.min_rtol):
        assert compare(torch.from_numpy(expected), torch.from_numpy(actual),
                       Tolerance(1e-4, m.min_rtol, baseline_factor=0.0)).verdict is Verdict.PASS
        assert compare(torch.from_numpy(expected), torch.from_numpy(actual),
                       Tolerance(1e-4, m.min_rtol * 0.99, baseline_factor=0.0)).verdict is Verdict.MISMATCH


def test_zero_expected_zero_error_and_a_miss_at_zero():
    zeros = torch.zeros(4)
    same = compare(zeros, zeros.clone(), Tolerance(1e-5, 1e-3)).metrics
    assert same.sqnr is None and same.rel_l2 == 0.0 and same.mean_dev == 0.0 and same.min_rtol == 0.0
    missed = compare(zeros, torch.tensor([0.0, 0.5, 0.0, 0.0]), Tolerance(1e-5, 1e-3)).metrics
    assert missed.sqnr == -math.inf and missed.rel_l2 == math.inf and missed.min_rtol == math.inf
    assert missed.mean_dev == pytest.approx(0.125)


def test_a_nan_where_a_number_was_expected_is_left_out_of_the_statistics_and_fails():
    c = compare(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, math.nan, 3.0]), Tolerance(1e-5, 1e-5))
    assert c.verdict is Verdict.MISMATCH
    assert c.metrics.sqnr == math.inf and c.metrics.mean_dev == 0.0    # the two finite pairs agree


def test_the_statistics_are_columns_and_in_a_mismatchs_message():
    c = compare(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 2.5, 4.0]), Tolerance(1e-5, 1e-5))
    assert c.verdict is Verdict.MISMATCH
    assert "min_rtol=0.25" in c.message and "SQNR" in c.message
    line = c.metrics.to_json()
    assert {"sqnr", "mean_dev", "rel_l2", "min_rtol", "min_atol"} <= set(line)
    back = Metrics.from_json(line)
    assert (back.sqnr, back.mean_dev, back.rel_l2, back.min_rtol) == (c.metrics.sqnr, c.metrics.mean_dev,
                                                                      c.metrics.rel_l2, c.metrics.min_rtol)


def test_each_floating_output_gets_its_own_statistics():
    e1, a1 = np.array([1.0, -2.0, 3.0]), np.array([1.0, -2.2, 3.0])
    e2, a2 = np.array([10.0, 0.0, 0.0, 5.0]), np.array([10.0, 0.0, 0.0, 5.0])
    idx = torch.tensor([1, 2])
    c = compare((torch.tensor(e1), torch.tensor(e2), idx), (torch.tensor(a1), torch.tensor(a2), idx),
                Tolerance(1e-5, 1e-5))
    first, second = c.metrics.outputs        # the integer output has no statistics
    assert (first.output, first.numel, second.output) == ("out[0]", 3, "out[1]")
    hand = _by_hand(e1, a1, 1e-5, 1e-5)
    for key in ("sqnr", "mean_dev", "rel_l2", "min_atol", "min_rtol"):
        assert getattr(first, key) == pytest.approx(hand[key], rel=1e-12, abs=1e-15), key
    assert second.sqnr == math.inf and second.rel_l2 == 0.0 and second.max_abs == 0.0
    # the result's own numbers are over every compared element together, the exact ones too
    power = (e1 ** 2).sum() + (e2 ** 2).sum() + 1 + 4
    assert c.metrics.sqnr == pytest.approx(10 * math.log10(power / 0.04))
    back = Metrics.from_json(c.metrics.to_json())
    assert back.outputs == c.metrics.outputs
