"""Malformed suites: each gives a SuiteError naming file, field and what to do."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from opdiff_snap.core.errors import OpdiffError, SuiteError
from opdiff_snap.suite import load_suites

HEAD = "dims: {B: 2, N: 4}\npresets:\n  inp: {type: tensor, shape: [B, N], kind: float}\n"
MODELS = "import torch\nclass Scale(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def t(op: str = "aten::add.Tensor", inputs: str = "[{ref: inp}]", extra: str = "") -> str:
    return HEAD + f"tests:\n  - id: t1\n    op: {op}\n    in: {inputs}\n" + extra


TPL = "{type: template_module, path: torch.nn.Linear, vars: {n: [2, 3]}, args: [%s, 4]}"

# name, files (s.yaml is loaded), expected field ('' = top level / any), substrings of the message
CASES = [
    ("unknown_top_key", {"s.yaml": "test: []\n"}, "test", ["unknown key 'test'", "did you mean 'tests'"]),
    ("tests_not_list", {"s.yaml": "tests: {a: 1}\n"}, "tests", ["tests must be a list"]),
    ("defines_nothing", {"s.yaml": "{}\n"}, "", ["the suite defines nothing"]),
    ("top_not_mapping", {"s.yaml": "- a\n- b\n"}, "", ["must be a mapping"]),
    ("unknown_test_key", {"s.yaml": t(extra="    kwarg: {}\n")}, "tests[0].kwarg",
     ["unknown key 'kwarg'", "did you mean 'kwargs'"]),
    ("unknown_node_type", {"s.yaml": t(inputs="[{type: tensr, shape: [2]}]")}, "tests[0].in[0].type",
     ["unknown node type 'tensr'", "did you mean 'tensor'"]),
    ("unknown_node_field", {"s.yaml": t(inputs="[{type: tensor, shpe: [2], shape: [2], kind: float}]")},
     "tests[0].in[0].shpe", ["unknown key 'shpe'", "did you mean 'shape'"]),
    ("undefined_dim", {"s.yaml": t(inputs="[{type: tensor, shape: [B, NN], kind: float}]")},
     "tests[0].in[0].shape[1]", ["'NN' is neither a number nor a defined dim", "did you mean 'N'"]),
    ("undefined_preset", {"s.yaml": t(inputs="[{ref: imp}]")}, "tests[0].in[0].ref",
     ["undefined preset 'imp'", "did you mean 'inp'"]),
    ("undefined_var", {"s.yaml": t(op=TPL % "{var: nn}")}, "tests[0].op.args[0]",
     ["undefined template var 'nn'", "did you mean 'n'"]),
    ("var_outside_template", {"s.yaml": t(op="{type: module, path: torch.nn.Linear, args: [{var: n}, 2]}")},
     "tests[0].op.args[0]", ["used outside a template"]),
    ("include_cycle", {"s.yaml": "include: a.yaml\ntests: []\n", "a.yaml": "include: s.yaml\ntests: []\n"},
     "include", ["include cycle", "s.yaml -> a.yaml -> s.yaml"]),
    ("missing_include", {"s.yaml": "include: [nope.yaml]\ntests: []\n"}, "include[0]",
     ["nope.yaml", "file not found"]),
    ("duplicate_dim", {"s.yaml": "include: a.yaml\ndims: {B: 3}\ntests: []\n", "a.yaml": "dims: {B: 2}\ntests: []\n"},
     "dims.B", ["dim 'B' is defined as 3 here and as 2 at", "a.yaml:1"]),
    ("duplicate_preset", {"s.yaml": "include: a.yaml\n" + t(), "a.yaml": "presets: {inp: {type: const, value: 1}}\n"
                                                                         "tests: []\n"},
     "presets.inp", ["preset 'inp' is defined here and differently at", "a.yaml:1"]),
    ("duplicate_id", {"s.yaml": t() + "  - id: t1\n    op: aten::add.Tensor\n    in: []\n"}, "",
     ["duplicate test id 't1'"]),
    ("scalar_low_ge_high", {"s.yaml": t(inputs="[{type: scalar, kind: float, low: 2, high: 2}]")},
     "tests[0].in[0].low", ["low=2", "must be below high=2"]),
    ("tensor_low_gt_high", {"s.yaml": t(inputs="[{type: tensor, shape: [2], kind: int, low: 5, high: 1}]")},
     "tests[0].in[0].low", ["low=5 is above high=1"]),
    ("p_outside", {"s.yaml": t(inputs="[{type: tensor, shape: [2], kind: bool, p: 1.5}]")},
     "tests[0].in[0].p", ["p=1.5 must lie in [0, 1]"]),
    ("p_none_outside", {"s.yaml": t(inputs="[{type: optional, p_none: -0.1, elem: {ref: inp}}]")},
     "tests[0].in[0].p_none", ["must be >= 0"]),
    ("missing_file_module", {"s.yaml": t(op="{type: module, path: 'file:nope.py::Scale'}")},
     "tests[0].op.path", ["nope.py", "file not found"]),
    ("missing_class_in_file", {"s.yaml": t(op="{type: module, path: 'file:models.py::Scal'}"), "models.py": MODELS},
     "tests[0].op.path", ["has no 'Scal'", "did you mean 'Scale'"]),
    ("missing_dotted_class", {"s.yaml": t(op="{type: module, path: torch.nn.Linearr}")},
     "tests[0].op.path", ["has no 'Linearr'", "did you mean 'Linear'"]),
    ("missing_construct_module", {"s.yaml": t(op="{type: module, path: torch.nn.Sequential, args: "
                                                 "[{type: construct, path: nomod.Thing}]}")},
     "tests[0].op.args[0].path", ["cannot find module 'nomod'"]),
    ("builtin_as_module", {"s.yaml": t(op="{type: module, path: os.system, args: [{type: const, value: 'true'}]}")},
     "tests[0].op.path", ["'os.system' names a builtin", "must name a class or a function"]),
    ("plain_class_as_module", {"s.yaml": t(op="{type: module, path: subprocess.Popen}")},
     "tests[0].op.path", ["a class that is not an nn.Module subclass"]),
    ("file_module_syntax_error", {"s.yaml": t(op="{type: module, path: 'file:broken.py::Scale'}"),
                                  "broken.py": "class Scale(torch.nn.Module):\n    def forward(self, x)\n"},
     "tests[0].op.path", ["broken.py:2: syntax error"]),
    ("file_plain_class", {"s.yaml": t(op="{type: module, path: 'file:plain.py::Plain'}"),
                          "plain.py": "import os\nos._exit(0)\nclass Plain:\n    pass\n"},
     "tests[0].op.path", ["plain.py:3", "not an nn.Module subclass"]),
    ("unknown_op", {"s.yaml": t(op="aten::nope")}, "tests[0].op", ["torch has no operator aten::nope"]),
    ("unknown_overload", {"s.yaml": t(op="aten::add.Tensr")}, "tests[0].op",
     ["has no overload 'Tensr'", "did you mean 'Tensor'"]),
    ("namespace_attribute_as_op", {"s.yaml": t(op="aten::__setattr__")}, "tests[0].op",
     ["torch has no operator aten::__setattr__"]),
    ("packet_attribute_as_overload", {"s.yaml": t(op="aten::add.__init__")}, "tests[0].op",
     ["aten::add has no overload '__init__'"]),
    ("yaml_syntax", {"s.yaml": "tests:\n  - id: [unclosed\n    op: x\n"}, "", ["YAML syntax error"]),
    ("empty_shape", {"s.yaml": t(inputs="[{type: tensor, shape: [], kind: float}]")}, "tests[0].in[0].shape",
     ["shape must be a non-empty list"]),
    ("var_in_shape", {"s.yaml": t(op=TPL % "{var: n}", inputs="[{type: tensor, shape: [{var: n}], kind: float}]")},
     "tests[0].in[0].shape[0]", ["template var is not allowed here"]),
    ("bad_dtype", {"s.yaml": t(inputs="[{type: tensor, shape: [2], dtype: float33}]")}, "tests[0].in[0].dtype",
     ["unknown dtype 'float33'", "did you mean 'float32'"]),
    ("bad_kind", {"s.yaml": t(inputs="[{type: tensor, shape: [2], kind: flaot}]")}, "tests[0].in[0].kind",
     ["unknown kind 'flaot'", "did you mean 'float'"]),
    ("negative_dim", {"s.yaml": "dims: {B: -1}\ntests: []\n"}, "dims.B", ["must be a non-negative integer"]),
    ("negative_list_len", {"s.yaml": t(inputs="[{type: list, len: -2, elem: {ref: inp}}]")},
     "tests[0].in[0].len", ["must be >= 0"]),
    ("empty_int_list", {"s.yaml": t(inputs="[{type: int_list, elems: []}]")}, "tests[0].in[0].elems",
     ["non-empty list of ints"]),
    ("const_tensor_shape", {"s.yaml": t(inputs="[{type: const_tensor, shape: [2, 2], kind: float, value: [1, 2]}]")},
     "tests[0].in[0].value", ["value has shape [2] but shape is [2, 2]"]),
    ("case_unknown_var", {"s.yaml": t(op="{type: template_module, path: torch.nn.Linear, vars: {width: [2]}, "
                                         "cases: [{widht: 2}], args: [{var: width}, 4]}")},
     "tests[0].op.cases[0].widht", ["unknown key 'widht'", "did you mean 'width'"]),
    ("seeds_zero", {"s.yaml": t(extra="    seeds: 0\n")}, "tests[0].seeds", ["positive count"]),
    ("tolerance_bad", {"s.yaml": t(extra="    tolerance: {fp16: {atl: 1}}\n")}, "tests[0].tolerance.fp16.atl",
     ["unknown key 'atl'", "did you mean 'atol'"]),
    ("device_bad", {"s.yaml": t(extra="    device: tpu\n")}, "tests[0].device", ["device 'tpu'"]),
    ("duplicate_yaml_key", {"s.yaml": t(extra="    op: aten::mul.Tensor\n")}, "", ["key 'op' appears twice"]),
    ("low_without_high", {"s.yaml": t(inputs="[{type: tensor, shape: [2], kind: float, low: 1}]")},
     "tests[0].in[0]", ["give both 'low' and 'high'"]),
    ("ref_var_not_preset", {"s.yaml": t(op=TPL % "{var: n}", inputs="[{ref: {var: n}}]")},
     "tests[0].in[0].ref", ["must name a preset"]),
    ("missing_op", {"s.yaml": HEAD + "tests:\n  - id: t1\n    in: []\n"}, "tests[0]", ["missing required field 'op'"]),
    ("complex_cast_int", {"s.yaml": t(inputs="[{type: tensor, shape: [3], kind: int}]",
                                      extra="    cast_input0_to_complex: true\n")},
     "tests[0].cast_input0_to_complex", ["needs input 0 to be a complex tensor"]),
    ("pair_side_no_impl", {"s.yaml": t(op="{type: template_compare_pair, a: {type: module, path: torch.nn.ReLU}, "
                                         "b: {impl: x, type: module, path: torch.nn.ReLU}}")},
     "tests[0].op.a", ["needs an 'impl'"]),
    ("defaults_unknown", {"s.yaml": "defaults: {seed: 3}\ntests: []\n"}, "defaults.seed",
     ["unknown key 'seed'", "did you mean 'seeds'"]),
    ("tags_not_list", {"s.yaml": t(extra="    tags: fast\n")}, "tests[0].tags", ["tags must be a list"]),
    ("bad_id_chars", {"s.yaml": HEAD + "tests:\n  - id: a/b\n    op: aten::add.Tensor\n    in: []\n"}, "tests[0].id",
     ["must be a non-empty string without spaces"]),
    ("module_in_inputs", {"s.yaml": t(inputs="[{type: module, path: torch.nn.ReLU}]")}, "tests[0].in[0]",
     ["belongs in a test's 'op'"]),
    ("preset_cycle", {"s.yaml": "presets: {a: {ref: b}, b: {ref: a}}\ntests: []\n"}, "", ["preset cycle"]),
]


def load_problems(tmp_path: Path, files: dict[str, str]) -> SuiteError:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    with pytest.raises(SuiteError) as info:
        load_suites([tmp_path / "s.yaml"])
    return info.value


def test_enough_cases():
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name,files,field,needles", CASES, ids=[c[0] for c in CASES])
def test_malformed(tmp_path, monkeypatch, name, files, field, needles):
    monkeypatch.chdir(tmp_path)
    err = load_problems(tmp_path, files)
    assert isinstance(err, OpdiffError) and err.exit_code == 2
    hits = [p for p in err.problems if all(n in str(p) for n in needles)]
    assert hits, f"no problem contains {needles}:\n{err}"
    p = hits[0]
    assert p.file.endswith(".yaml")
    if field:
        assert p.field == field, str(p)
    if name not in ("duplicate_id", "preset_cycle"):
        assert p.line is not None and p.column is not None, str(p)


def test_every_problem_in_one_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = (HEAD + "bogus: 1\n"
            "tests:\n"
            "  - id: t1\n"
            "    op: aten::nope\n"
            "    in: [{type: tensor, shape: [B, Q], kind: float}]\n"
            "  - id: t2\n"
            "    op: {type: module, path: torch.nn.Linearr}\n"
            "    in: [{ref: inpp}]\n"
            "    seeds: -1\n")
    err = load_problems(tmp_path, {"s.yaml": text})
    got = {(p.field, p.line, p.test_id) for p in err.problems}
    assert got == {("bogus", 4, ""), ("tests[0].op", 7, "t1"), ("tests[0].in[0].shape[1]", 8, "t1"),
                   ("tests[1].op.path", 10, "t2"), ("tests[1].in[0].ref", 11, "t2"),
                   ("tests[1].seeds", 12, "t2")}, str(err)
    assert str(err).startswith("6 problems in suite input:")
    assert "s.yaml:8:" in str(err)


def test_problems_across_files_are_reported_together(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("tests: [{id: a, op: aten::nope, in: []}]\n")
    (tmp_path / "b.yaml").write_text("tests: [{id: b, op: aten::nada, in: []}]\n")
    with pytest.raises(SuiteError) as info:
        load_suites([tmp_path / "a.yaml", tmp_path / "b.yaml"])
    assert [p.file for p in info.value.problems] == ["a.yaml", "b.yaml"]
