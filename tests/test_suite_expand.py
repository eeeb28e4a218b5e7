"""Expansion: ids and order as the format page states, definitions, discovery, selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from opdiff_snap.suite import case_from_definition, discover_suites, load_suites, select
from opdiff_snap.suite.model import Tolerance

FULL = Path(__file__).parent / "suites" / "full"

EXPECTED_IDS = [
    "common_add",                                   # included tests come first
    "mul_Tensor_0",                                 # no id: <op name>_<index in file>
    "every_node",
    "misc_nodes",
    # the format page's own example: sorted var names, last one fastest, dim symbol kept
    "lin__bias=True__in_features=N__out_features=3",
    "lin__bias=True__in_features=N__out_features=5",
    "lin__bias=False__in_features=N__out_features=3",
    "lin__bias=False__in_features=N__out_features=5",
    # no id -> "template"; cases in the order given, each one's product inside it
    "template__in_features=8__input_preset=x_feat8__out_features=2",
    "template__in_features=8__input_preset=x_feat8__out_features=3",
    "template__in_features=4__input_preset=x_feat4__out_features=2",
    "ln__elementwise_affine=True__eps=0_5",         # 0.5 -> 0_5
    "ln__elementwise_affine=True__eps=1e-05",       # str(1e-05)
    "scaled",
    "fft",
    "lin_pair__in_features=N__out_features=8",
    "lin_pair__in_features=N__out_features=16",
    "template_compare_pair__k=3__s=1",              # no id; cases: [{k: 3}]
    "template_compare_pair__k=3__s=2",
]


@pytest.fixture(scope="module")
def cases():
    return load_suites([FULL / "main.yaml"])


def test_ids_in_order(cases):
    assert [c.id for c in cases] == EXPECTED_IDS


def test_every_node_type_is_used():
    text = (FULL / "main.yaml").read_text() + (FULL / "base" / "common.yaml").read_text()
    for t in ("tensor", "scalar", "scalar_tensor", "const", "const_tensor", "int_list", "list", "tuple",
              "optional", "module", "construct", "template_module", "template_compare_pair"):
        assert f"type: {t}" in text
    assert "{ref:" in text and "{var:" in text


def test_resolved_nodes_and_calls(cases):
    by = {c.id: c for c in cases}
    lin = by["lin__bias=False__in_features=N__out_features=5"]
    assert lin.call.kind == "module" and lin.call.target == "torch.nn.Linear"
    assert lin.call.args == ({"type": "const", "value": 4}, {"type": "const", "value": 5})   # N -> 4
    assert lin.call.kwargs == {"bias": {"type": "const", "value": False}}
    assert lin.inputs[0]["shape"] == [2, 4]
    add = by["common_add"]
    assert add.call.kind == "op" and add.call.target == "aten::add.Tensor"
    assert add.inputs[0] == add.inputs[1] == {"type": "tensor", "shape": [2, 4], "dtype": "float32",
                                              "init": "normal", "mean": 0.0, "std": 1.0, "requires_grad": False}
    node = by["every_node"].inputs[0]
    assert node["len"] == 3 and node["elem"]["shape"] == [2, 5] and node["elem"]["init"] == "uniform"
    assert by["misc_nodes"].inputs[2]["elems"][0] == {"type": "int_list", "elems": [1, 4, 2]}
    tpl = by["template__in_features=4__input_preset=x_feat4__out_features=2"]
    assert tpl.inputs[0]["shape"] == [2, 4]        # ref via var selects the preset


def test_pairs_and_common(cases):
    by = {c.id: c for c in cases}
    p = by["lin_pair__in_features=N__out_features=16"]
    assert p.test_type == "pair"
    assert (p.call.target, p.call.impl, p.pair.target, p.pair.impl) == (
        "torch.nn.Linear", "torch", "file:models.py::MyLinear", "mine")
    assert p.call.args == p.pair.args == ({"type": "const", "value": 4}, {"type": "const", "value": 16})
    assert p.pair.kwargs == {"bias": {"type": "const", "value": True}}
    q = by["template_compare_pair__k=3__s=2"]
    assert dict(q.call.kwargs) == {"kernel_size": {"type": "const", "value": 3},
                                   "stride": {"type": "const", "value": 2}}
    assert q.pair.kwargs["padding"] == {"type": "const", "value": 1} and "padding" not in q.call.kwargs


def test_extensions_and_defaults(cases):
    by = {c.id: c for c in cases}
    assert by["common_add"].seeds == (0, 1) and by["common_add"].tags == ("full",)   # outer defaults
    s = by["scaled"]
    assert s.tolerance == {"*": Tolerance(1e-4, 1e-3)} and s.tags == ("module",) and s.grad
    assert s.skip == {"coreml_*": "not on linux"}
    assert s.source_files == ((FULL / "models.py").resolve(),)
    f = by["fft"]
    assert f.seeds == (3, 7) and f.cast_input0_to_complex
    assert f.tolerance == {"fp16": Tolerance(1e-2, None), "onnx_cpu_fp32": Tolerance(0.0, 1e-5)}
    assert by["every_node"].out["shape"] == [6, 5]


def test_case_from_definition_round_trip(cases):
    import json
    for c in cases:
        stored = json.loads(json.dumps(c.definition))
        assert case_from_definition(c.id, stored, c.suite) == c


def test_discover_skips_included_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "orch.yaml").write_text("include: [sub/a.yaml, sub/b.yml]\n")
    (tmp_path / "sub" / "a.yaml").write_text("tests: []\n")
    (tmp_path / "sub" / "b.yml").write_text("tests: []\n")
    (tmp_path / "c.yaml").write_text("tests: []\n")
    assert discover_suites(tmp_path) == [tmp_path / "c.yaml", tmp_path / "orch.yaml"]
    assert [p.relative_to(FULL).as_posix() for p in discover_suites(FULL)] == ["main.yaml"]


def test_select(cases):
    ids = lambda cs: [c.id for c in cs]
    assert ids(select(cases, ["lin__*;fft"], None)) == EXPECTED_IDS[4:8] + ["fft"]
    assert ids(select(cases, ["fft", "scaled"], None)) == ["scaled", "fft"]      # flag repeats
    assert ids(select(cases, ["ff"], None)) == []                                 # exact unless '*'
    assert ids(select(cases, None, ["module"])) == ["scaled"]
    assert ids(select(cases, ["s*"], ["full", "module"])) == ["scaled"]
    assert select(cases, None, None) == cases


def test_loading_a_generated_suite(tmp_path):
    tests = "".join(f"  - id: t{i}\n    op: aten::add.Tensor\n    in: [{{ref: x}}, {{type: scalar, kind: float}}]\n"
                    f"    kwargs: {{alpha: {{type: const, value: {i}}}}}\n" for i in range(250))
    (tmp_path / "big.yaml").write_text("presets:\n  x: {type: tensor, shape: [2, 3], kind: float}\ntests:\n" + tests)
    assert len(load_suites([tmp_path / "big.yaml"])) == 250
