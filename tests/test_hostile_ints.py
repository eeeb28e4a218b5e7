"""Integers in a suite that the tensor (or the int64 torch makes of a Python int) cannot
hold: validate and record refuse them before anything runs (exit 2), naming the file,
the line, the test and the field; values at the very edge of each range are accepted and
recorded as given."""

from __future__ import annotations

import pytest
from helpers.cli import invoke
from helpers.hostile import FAST, assert_clean_failure, make_project, snapshot, tree_bytes

from opdiff_snap.goldens import GoldenStore

BIG = 2**70
X = "{type: tensor, shape: [2], dtype: int64}"

# (case, the test's inputs, the op, the field named, what is said)
REFUSED = [
    ("const_tensor", f"[{{type: const_tensor, shape: [1], dtype: int64, value: [{BIG}]}}]", "aten::neg",
     "in[0].value[0]", f"{BIG} does not fit int64"),
    ("randint-high", f"[{{type: tensor, shape: [2], dtype: int64, init: randint, low: 0, high: {BIG}}}]",
     "aten::neg", "in[0].high", f"{BIG} does not fit int64"),
    ("randint-low", f"[{{type: tensor, shape: [2], dtype: float32, init: randint, low: -{BIG}, high: 0}}]",
     "aten::neg", "in[0].low", f"-{BIG} does not fit int64"),
    ("scalar-value", f"[{X}, {{type: scalar, dtype: int64, value: {BIG}}}]", "aten::add.Tensor", "in[1].value",
     f"{BIG} does not fit int64"),
    ("scalar-high", f"[{X}, {{type: scalar, dtype: int64, low: 0, high: {2**63 - 1}}}]", "aten::add.Tensor",
     "in[1].high", f"{2**63 - 1} is too large: at most {2**63 - 2}"),
    ("scalar_tensor", f"[{{type: scalar_tensor, dtype: int64, value: {BIG}}}]", "aten::neg", "in[0].value",
     f"{BIG} does not fit int64"),
    ("int_list", f"[{{type: tensor, shape: [2], dtype: float32}}, {{type: int_list, elems: [{BIG}]}}]",
     "aten::sum.dim_IntList", "in[1].elems[0]", f"{BIG} does not fit int64"),
    ("uint8", "[{type: const_tensor, shape: [2], dtype: uint8, value: [255, 256]}]", "aten::neg",
     "in[0].value[1]", "256 does not fit uint8 (which holds 0 to 255)"),
    ("nested", "[{type: const_tensor, shape: [2, 2], dtype: int8, value: [[1, 2], [3, 300]]}]", "aten::neg",
     "in[0].value[1][1]", "300 does not fit int8"),
    ("int32-randint", "[{type: tensor, shape: [2], dtype: int32, init: randint, low: 0, high: 3000000000}]",
     "aten::neg", "in[0].high", "3000000000 does not fit int32"),
]


def _suite(inputs: str, op: str) -> str:
    return f"tests:\n  - id: big_int\n    op: {op}\n    in: {inputs}\n"


@pytest.mark.parametrize("command", [("validate",), ("record", *FAST)], ids=["validate", "record"])
@pytest.mark.parametrize("inputs, op, field, said", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_an_integer_out_of_range_is_named_before_anything_runs(tmp_path, command, inputs, op, field, said):
    project = make_project(tmp_path / "p")
    (project / "suites" / "s.yaml").write_text(_suite(inputs, op))
    column = inputs.index(said.split()[0]) + len("    in: ") + 1
    before = snapshot(project)
    code, out, err = invoke(project, *command)
    assert_clean_failure(code, out, err, 2, f"suites/s.yaml:4:{column}: test 'big_int': tests[0].{field}: {said}")
    assert snapshot(project) == before
    assert not (project / "goldens").exists() and not (project / "store").exists()


EDGES = [
    ("int64", f"[{{type: const_tensor, shape: [2], dtype: int64, value: [{-2**63}, {2**63 - 1}]}}]", "aten::neg"),
    ("randint", f"[{{type: tensor, shape: [2], dtype: int64, init: randint, low: {-2**63}, high: {2**63 - 2}}}]",
     "aten::abs"),
    ("uint8", "[{type: const_tensor, shape: [2], dtype: uint8, value: [0, 255]}]", "aten::abs"),
    ("scalar", f"[{X}, {{type: scalar, dtype: int64, value: {2**62}}}]", "aten::add.Tensor"),
]


@pytest.mark.slow
@pytest.mark.parametrize("inputs, op", [c[1:] for c in EDGES], ids=[c[0] for c in EDGES])
def test_integers_at_the_edge_of_their_range_are_recorded_as_given(tmp_path, inputs, op):
    project = make_project(tmp_path / "p")
    (project / "suites" / "s.yaml").write_text(_suite(inputs, op))
    code, out, err = invoke(project, "record", *FAST)
    assert code == 0, out + err
    golden = GoldenStore(project / "goldens").read("big_int", 0)
    if "const_tensor" in inputs:
        expected = [int(v) for v in inputs.split("value: [")[1].split("]")[0].split(",")]
        assert golden.invocation.args[0].tolist() == expected
    goldens = tree_bytes(project / "goldens")
    code, out, err = invoke(project, "check", "-b", "torch_cpu_fp32", *FAST)
    assert code == 0, out + err
    assert tree_bytes(project / "goldens") == goldens
