"""Record with the real torch baseline (worker pool), then read every golden back with
plain zarr in another process: inputs, parameters, buffers and outputs equal what eager
torch computes from the same seeded inputs, bit for bit, for every dtype the format
allows (0-d and empty tensors, nested outputs, kwargs included)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers.record import make_project, read_plain

from opdiff_snap import api
from opdiff_snap.core import trees
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.construct import build_modules, resolve_op
from opdiff_snap.suite.materialize import materialize

DTYPES = {  # dtype -> sampling fields
    "float16": "init: normal", "float32": "init: normal", "float64": "init: normal",
    "bfloat16": "init: normal", "complex64": "init: normal", "complex128": "init: normal",
    "int8": "init: randint, low: -128, high: 127", "int16": "init: randint, low: -3000, high: 3000",
    "int32": "init: randint, low: -100000, high: 100000",
    "int64": "init: randint, low: -100000, high: 100000",
    "uint8": "init: randint, low: 0, high: 255", "bool": "init: bernoulli, p: 0.5",
}


def suite_text() -> str:
    lines = ["tests:"]
    for dtype, fields in DTYPES.items():
        for tag, node in (("", "type: tensor, shape: [3, 2]"), ("0d_", "type: scalar_tensor"),
                          ("empty_", "type: tensor, shape: [0, 4]")):
            lines += [f"  - id: clone_{tag}{dtype}", "    op: aten::clone",
                      f"    in: [{{{node}, dtype: {dtype}, {fields}}}]"]
    lines.append("""\
  - id: max_dim_fp16                      # tuple output (values, int64 indices)
    op: aten::max.dim
    in: [{type: tensor, shape: [3, 5], dtype: float16, init: normal}, {type: const, value: 1}]
  - id: split_f64                         # list output
    op: aten::split.Tensor
    in: [{type: tensor, shape: [5, 2], dtype: float64, init: normal}, {type: const, value: 2}]
  - id: sum_kwargs                        # kwargs and an int list
    op: aten::sum.dim_IntList
    in: [{type: tensor, shape: [2, 3, 4], dtype: float32, init: uniform, low: -2, high: 2},
         {type: int_list, elems: [0, 2]}]
    kwargs: {keepdim: {type: const, value: true}}
  - id: nested_module                     # params, float and int buffers, nested outputs
    op: {type: module, path: "file:models.py::Nested", args: [{type: const, value: 4}]}
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal},
         {type: tensor, shape: [2, 4], dtype: bool, init: bernoulli, p: 0.3}]
  - id: batchnorm                         # running stats and num_batches_tracked
    op: {type: module, path: torch.nn.BatchNorm1d, args: [{type: const, value: 3}]}
    in: [{type: tensor, shape: [4, 3], dtype: float32, init: normal}]
""")
    return "\n".join(lines)


def raw(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return ""
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()).hex()


def eager_outputs(case, invocation):
    args, kwargs = copy.deepcopy(invocation.args), copy.deepcopy(invocation.kwargs)
    with torch.no_grad():
        if case.call.kind == "op":
            return resolve_op(case.call.target)(*args, **kwargs)
        module = build_modules(case)["a"]
        module.load_state_dict(invocation.states["a"])
        return module.eval()(*args, **kwargs)


def assert_section(stored: dict, section: str, value, where: str) -> None:
    structure, leaves = trees.flatten(value)
    assert stored[section] == structure, f"{where}: {section} structure"
    for i, t in enumerate(leaves):
        got = stored["arrays"][f"{section}.{i}"]
        name = f"{where}: {section}.{i}"
        assert got["torch_dtype"] == str(t.dtype).removeprefix("torch."), name
        assert got["shape"] == list(t.shape), name
        assert got["hex"] == raw(t), name


@pytest.mark.slow
def test_record_then_plain_zarr_reads_everything_bit_exactly(tmp_path: Path):
    project = make_project(tmp_path, suite_text())
    settings = Settings(suites=project / "suites", goldens=project / "goldens", store=project / "store",
                        jobs=1, repeats=1, warmup=0)
    report = api.record(api.RecordRequest(), settings=settings)
    assert {r.verdict for r in report.results} == {Verdict.RECORDED}, \
        [(r.test_id, r.verdict, r.message) for r in report.results if r.verdict != Verdict.RECORDED]

    stored = read_plain(project / "goldens")
    cases = load_suites([project / "suites" / "s.yaml"])
    assert len(cases) == len(DTYPES) * 3 + 5
    assert set(stored) == {f"{c.id}|0" for c in cases}
    seen_dtypes = set()
    for case in cases:
        golden = stored[f"{case.id}|0"]
        invocation = materialize(case, 0)
        assert golden["spec_hash"] == case.spec_hash
        assert_section(golden, "args", list(invocation.args), case.id)
        assert_section(golden, "kwargs", dict(invocation.kwargs), case.id)
        assert_section(golden, "outputs", eager_outputs(case, invocation), case.id)
        expected_states = {side: list(state) for side, state in invocation.states.items()}
        assert {side: [p for p, _ in entries] for side, entries in golden["states"].items()} == expected_states
        for side, entries in golden["states"].items():
            for param, array in entries:
                t = invocation.states[side][param]
                got = golden["arrays"][array]
                assert (got["hex"], got["shape"], got["torch_dtype"]) == \
                    (raw(t), list(t.shape), str(t.dtype).removeprefix("torch.")), f"{case.id}: {param}"
        seen_dtypes |= {a["torch_dtype"] for a in golden["arrays"].values()}
        assert golden["grads"] is None
    assert set(DTYPES) <= seen_dtypes
    # bfloat16 travels as its same-width integer view, described for plain readers
    assert stored["clone_bfloat16|0"]["arrays"]["outputs.0"]["dtype"] == "uint16"
    # the parts that must not be trivially equal: real buffers, an int buffer, a 0-d output
    nested = stored["nested_module|0"]
    assert {p for p, _ in nested["states"]["a"]} == {"lin.weight", "lin.bias", "scale", "steps"}
    assert stored["batchnorm|0"]["arrays"]["outputs.0"]["shape"] == [4, 3]
