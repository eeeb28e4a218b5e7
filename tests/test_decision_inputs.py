"""Tests whose output is a decision (isclose's threshold, argsort's order) have inputs that
decide the same once rounded to fp16 or bf16: a target at that precision computes on the
rounded inputs, so inputs near the decision would blame the test, not the backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opdiff_snap.suite.load import load_suites
from opdiff_snap.suite.materialize import materialize

SUITE = Path(__file__).resolve().parents[1] / "suites" / "core_aten.yaml"
REDUCED = (torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def args() -> dict[str, list]:
    cases = {c.id: c for c in load_suites([SUITE]) if c.id in ("isclose", "argsort")}
    return {name: materialize(case, 0).args for name, case in cases.items()}


def test_isclose_decides_the_same_at_every_precision(args):
    a, b = args["isclose"]
    expected = torch.isclose(a, b)
    assert not expected.all() and expected.any()          # both answers occur
    for dtype in REDUCED:
        assert torch.equal(torch.isclose(a.to(dtype), b.to(dtype)), expected), dtype


def test_argsort_values_stay_distinct_and_ordered_when_rounded(args):
    x, dim = args["argsort"]
    for dtype in REDUCED:
        rounded = x.to(dtype)
        assert torch.equal(rounded.float(), x), dtype     # exact: no value moves, none ties
        assert torch.equal(torch.argsort(rounded, dim), torch.argsort(x, dim))
    assert x.flatten().unique().numel() == x.numel()
