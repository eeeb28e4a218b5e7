"""The model zoo: transformers names located without importing transformers, models built
from a `config` mapping (and every way such a config can be wrong), transformers outputs
(ModelOutput, DynamicCache, any pytree-registered type) stored as plain containers, and
tiny zoo models recorded and checked for real on torch and ONNX Runtime."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

from opdiff_snap import api
from opdiff_snap.core import trees
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError, SuiteError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.execution.prepare import prepare_call
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.locate import Kind, NotFound, locate_dotted
from opdiff_snap.suite.materialize import materialize

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parent.parent
ZOO = REPO / "suites" / "zoo"
GPT2 = "n_layer: 1, n_embd: 16, n_head: 2, vocab_size: 32, n_positions: 16, bos_token_id: 0, eos_token_id: 1"


def suite(tmp_path: Path, tests: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text("tests:\n" + textwrap.indent(textwrap.dedent(tests), "  "))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(SuiteError) as err:
        load_suites([Path(path.name)])   # from its folder, so messages name it as given
    return [str(p) for p in err.value.problems]


# ---------------------------------------------------------------- lazily exported names

def test_transformers_names_locate_without_importing_transformers():
    code = textwrap.dedent("""
        import sys
        from opdiff_snap.suite.locate import locate_dotted
        for path in ("transformers.GPT2LMHeadModel", "transformers.models.gpt2.GPT2Config",
                     "transformers.models.whisper.modeling_whisper.WhisperEncoder", "transformers.DynamicCache"):
            found = locate_dotted(path)
            print(found.kind.name, found.where.rsplit("/", 1)[-1].split(":")[0])
        print("transformers imported:", "transformers" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines() == ["CLASS modeling_gpt2.py", "CLASS configuration_gpt2.py",
                                       "CLASS modeling_whisper.py", "CLASS cache_utils.py",
                                       "transformers imported: False"]


def lazy_package(root: Path) -> None:
    """A package built as transformers builds its own: a `_LazyModule` in sys.modules and
    names listed in its modules' `__all__` (and in its TYPE_CHECKING block)."""
    pkg = root / "lazypkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import sys
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from .helpers import Helper as Helper
            from .sub.blocks import *
        else:
            sys.modules[__name__] = _LazyModule(__name__, __file__, {})
    """))
    (pkg / "helpers.py").write_text("class Helper:\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "blocks.py").write_text("import torch\n\n\nclass Block(torch.nn.Module):\n    pass\n\n\n"
                                           "def make_block():\n    return Block()\n\n\n"
                                           "__all__ = ['Block', 'make_block']\n")
    (pkg / "sub" / "modular_blocks.py").write_text("class Stale:\n    pass\n\n\n__all__ = ['Stale']\n")


def test_a_lazy_package_exports_what_its_modules_list(tmp_path, monkeypatch):
    lazy_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert locate_dotted("lazypkg.Block").kind is Kind.CLASS
    assert locate_dotted("lazypkg.Block").where.endswith("blocks.py:4")
    assert locate_dotted("lazypkg.make_block").kind is Kind.FUNCTION
    assert locate_dotted("lazypkg.Helper").where.endswith("helpers.py:1")   # through the TYPE_CHECKING import
    with pytest.raises(NotFound, match="this lazily loaded package exports no 'Blok' \\(did you mean 'Block'\\?\\)"):
        locate_dotted("lazypkg.Blok")
    with pytest.raises(NotFound, match="exports no 'Stale'"):   # modular_* files are no part of it
        locate_dotted("lazypkg.Stale")


def test_a_loaded_lazy_module_is_never_asked_for_a_name(tmp_path, monkeypatch):
    """Asking a lazy module for a name imports the module behind it, in the parent."""
    lazy_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    class Lazy(type(sys)):
        def __getattr__(self, name):
            raise AssertionError(f"locate asked the lazy module for {name}")

    loaded = Lazy("lazypkg")
    loaded.__spec__ = importlib.util.find_spec("lazypkg")   # as a _LazyModule keeps its package's spec
    monkeypatch.setitem(sys.modules, "lazypkg", loaded)
    assert locate_dotted("lazypkg.Block").kind is Kind.CLASS


def test_missing_transformers_says_which_extra_installs_it(tmp_path, monkeypatch):
    """An environment without transformers, as the parent sees it: no spec to find, and
    not imported (the only two ways locate looks for a package)."""
    monkeypatch.chdir(tmp_path)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "transformers" else real(name, *a))
    for name in [m for m in sys.modules if m == "transformers" or m.startswith("transformers.")]:
        monkeypatch.delitem(sys.modules, name)
    path = suite(tmp_path, f"""\
        - id: gpt2
          op: {{type: module, path: transformers.GPT2LMHeadModel, config: {{{GPT2}}}}}
          in: [{{type: tensor, shape: [1, 4], dtype: int64}}]
        """)
    (message,) = problems(path)
    assert message.startswith("s.yaml:3:30: test 'gpt2': tests[0].op.path: ")
    assert message.endswith("'transformers.GPT2LMHeadModel': transformers is not installed in this environment; "
                            "install the extra that brings it: pip install 'opdiff-snap[zoo]'")


# ---------------------------------------------------------------- the config form

def test_config_is_part_of_the_definition_and_the_spec_hash(tmp_path):
    one = suite(tmp_path, f"""\
        - id: gpt2
          op: {{type: module, path: transformers.GPT2LMHeadModel, config: {{{GPT2}, use_cache: false}}}}
          in: [{{type: tensor, shape: [1, 4], dtype: int64, init: randint, low: 0, high: 31}}]
        - id: linear
          op: {{type: module, path: torch.nn.Linear, args: [4, 2]}}
          in: [{{type: tensor, shape: [1, 4], dtype: float32}}]
        """, "one.yaml")
    two = suite(tmp_path, one.read_text().split("tests:\n", 1)[1].replace("n_layer: 1", "n_layer: 2"), "two.yaml")
    a, linear = load_suites([one])
    b, _ = load_suites([two])
    assert a.call.config == {**dict(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                                    eos_token_id=1), "use_cache": False}
    assert a.definition["call"]["config"] == a.call.config
    assert a.spec_hash != b.spec_hash
    assert "config" not in linear.definition["call"]   # tests without one hash as before


def test_config_in_a_template_takes_vars(tmp_path):
    path = suite(tmp_path, f"""\
        - id: gpt2
          op: {{type: template_module, path: transformers.GPT2LMHeadModel, vars: {{layers: [1, 2]}},
               config: {{{GPT2.replace("n_layer: 1", "n_layer: {var: layers}")}, use_cache: false}}}}
          in: [{{type: tensor, shape: [1, 4], dtype: int64}}]
        """)
    assert [(c.id, c.call.config["n_layer"]) for c in load_suites([path])] == \
        [("gpt2__layers=1", 1), ("gpt2__layers=2", 2)]


def test_what_validation_refuses_in_a_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = suite(tmp_path, """\
        - id: notamap
          op: {type: module, path: transformers.GPT2LMHeadModel, config: [1, 2]}
          in: []
        - id: values
          op: {type: module, path: transformers.GPT2LMHeadModel,
               config: {layer_norm_epsilon: 1e-5, initializer_range: .nan, 3: x, when: 2020-01-01}}
          in: []
        """)
    assert problems(path) == [
        "s.yaml:3:68: test 'notamap': tests[0].op.config: config must map setting names to values, "
        "e.g. {n_layer: 2}, got [1, 2]",
        "s.yaml:7:39: test 'values': tests[1].op.config.layer_norm_epsilon: '1e-5' reads as a string: YAML 1.1 "
        "wants a dot and a signed exponent in a float, so write 1.0e-5 for the number",
        "s.yaml:7:64: test 'values': tests[1].op.config.initializer_range: nan is not a finite number",
        "s.yaml:7:70: test 'values': tests[1].op.config[3]: config key 3 is not a setting name (a Python identifier)",
        "s.yaml:7:82: test 'values': tests[1].op.config.when: date value datetime.date(2020, 1, 1) is not allowed "
        "here; quote it as a string",
    ]


BAD_CONFIGS = """\
    - id: typo
      op: {type: module, path: transformers.GPT2LMHeadModel, config: {n_layr: 1, n_embd: 16}}
      in: [{type: tensor, shape: [1, 4], dtype: int64}]
    - id: badvalue
      op: {type: module, path: transformers.GPT2LMHeadModel, config: {n_layer: one}}
      in: [{type: tensor, shape: [1, 4], dtype: int64}]
    - id: noconfigclass
      op: {type: module, path: torch.nn.Linear, config: {in_features: 4}}
      in: [{type: tensor, shape: [1, 4], dtype: float32}]
    - id: billion
      op: {type: module, path: transformers.GPT2LMHeadModel, config: {n_layer: 100000000000}}
      in: [{type: tensor, shape: [1, 4], dtype: int64}]
    - id: floatsize
      op: {type: module, path: transformers.GPT2LMHeadModel, config: {n_embd: 1.0e+9}}
      in: [{type: tensor, shape: [1, 4], dtype: int64}]
    - id: negative
      op: {type: module, path: transformers.GPT2LMHeadModel, config: {n_head: -2}}
      in: [{type: tensor, shape: [1, 4], dtype: int64}]
    """
BAD_MESSAGES = {
    "typo": "config key 'n_layr' is not a setting of GPT2Config (did you mean 'n_layer'?), and neither "
            "transformers.models.gpt2.modeling_gpt2 nor the config's code reads it: transformers would keep it as "
            "an attribute no layer reads, so the model would not be the one the suite describes. Fix or remove "
            "config.n_layr.",
    "badvalue": "GPT2Config cannot take n_layer: 'one': it is an integer setting (default 12), and this is a str.",
    "billion": "GPT2Config cannot take n_layer: 100000000000: more than 10,000,000 in one setting would not fit "
               "in a worker's memory",
    "floatsize": "GPT2Config cannot take n_embd: 1000000000.0: it is an integer setting (default 768), and this is "
                 "a float.",
    "negative": "GPT2Config cannot take n_head: -2: a size or count is not negative.",
    "noconfigclass": "'torch.nn.Linear' has no config_class, so a `config` mapping cannot build it: `config` is "
                     "for classes built from a configuration object, such as transformers models "
                     "(transformers.GPT2LMHeadModel). Pass this class's arguments as args and kwargs instead.",
}


def test_a_config_the_class_refuses_names_the_file_test_and_key_when_built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite(tmp_path, BAD_CONFIGS)
    for case in load_suites([Path("s.yaml")]):
        with pytest.raises(OpdiffError) as err:
            materialize(case, 0)
        assert str(err.value).startswith(f"s.yaml: test '{case.id}': {BAD_MESSAGES[case.id]}"), str(err.value)


def test_validate_builds_each_config_in_a_worker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite(tmp_path, BAD_CONFIGS)
    with pytest.raises(SuiteError) as err:
        api.validate([Path("s.yaml")], in_process=True)
    found = {p.test_id: p for p in err.value.problems}
    assert set(found) == set(BAD_MESSAGES)
    for test_id, p in found.items():
        path = "torch.nn.Linear" if test_id == "noconfigclass" else "transformers.GPT2LMHeadModel"
        assert p.file == "s.yaml" and p.message.startswith(f"{path}: {BAD_MESSAGES[test_id]}"), p.message
    assert found["badvalue"].message.endswith("Fix that value in the test's config.")


def test_keys_the_model_reads_are_known_though_its_config_class_lacks_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = suite(tmp_path, """\
        - id: t5
          op: {type: module, path: transformers.T5ForConditionalGeneration,
               config: {vocab_size: 32, d_model: 16, d_kv: 4, d_ff: 32, num_layers: 1, num_heads: 2,
                        decoder_start_token_id: 0, attn_implementation: eager}}
          in: []
        """)
    (case,) = load_suites([path])
    model_state = materialize(case, 0).states["a"]
    assert "shared.weight" in model_state


def test_weights_are_seeded_and_stored_like_any_modules():
    (case,) = [c for c in load_suites([ZOO / "text.yaml"]) if c.id == "zoo_gpt2"]
    torch.manual_seed(1)
    a = materialize(case, 0)
    torch.rand(3)
    b = materialize(case, 0)
    assert a.states["a"].keys() == b.states["a"].keys() and len(a.states["a"]) > 10
    assert all(torch.equal(a.states["a"][k], b.states["a"][k]) for k in a.states["a"])


# ---------------------------------------------------------------- outputs

def tiny_gpt2(**config):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16,
                                  bos_token_id=0, eos_token_id=1, **config)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_a_model_output_is_stored_as_the_dict_of_its_fields():
    ids = torch.randint(0, 31, (1, 4))
    model = tiny_gpt2(use_cache=False, output_hidden_states=True)
    prepared = prepare_call({"a": model}, [ids], {}, "test 'gpt2'")
    assert [k for k, _ in prepared.out_structure["dict"]] == ["logits", "hidden_states"]
    with torch.no_grad():
        outputs = list(prepared.module(*prepared.inputs))
        expected = model(ids)
    value = restore_outputs(prepared.out_structure, outputs)
    assert type(value) is dict and torch.equal(value["logits"], expected.logits)
    assert isinstance(value["hidden_states"], tuple) and len(value["hidden_states"]) == 2
    structure, leaves = trees.flatten(expected)   # a golden stores a ModelOutput the same way
    assert structure == prepared.out_structure and len(leaves) == 3


def test_a_dynamic_cache_output_says_to_set_use_cache_false():
    prepared = pytest.raises(OpdiffError, prepare_call, {"a": tiny_gpt2()}, [torch.randint(0, 31, (1, 4))], {},
                             "test 'gpt2'")
    assert str(prepared.value) == (
        "test 'gpt2' returns a DynamicCache as output['past_key_values']: the key/value cache a transformers "
        "model returns while use_cache is on. Set use_cache: false in the test's config. (The cache cannot be "
        "compared: torch.utils._pytree has no registration for transformers.cache_utils.DynamicCache to take its "
        "tensors out; registering one with torch.utils._pytree.register_pytree_node where the module is built "
        "would compare them.)")


@dataclasses.dataclass
class KeyValues:
    keys: list
    values: list


class ReturnsKeyValues(torch.nn.Module):
    def forward(self, x):
        return {"out": x * 2, "cache": KeyValues([x + 1, x - 1], [x * 3])}


@pytest.fixture
def registered_key_values():
    pytree.register_dataclass(KeyValues)
    yield
    pytree._deregister_pytree_node(KeyValues)


def test_a_pytree_registered_output_is_stored_by_its_registration(registered_key_values):
    x = torch.randn(2, 3)
    prepared = prepare_call({"a": ReturnsKeyValues()}, [x], {}, "test 'kv'")
    assert prepared.out_structure == {"dict": [
        ["out", {"tensor": 0}],
        ["cache", {"dict": [["keys", {"list": [{"tensor": 1}, {"tensor": 2}]}], ["values", {"list": [{"tensor": 3}]}]]}]]}
    with torch.no_grad():
        value = restore_outputs(prepared.out_structure, list(prepared.module(*prepared.inputs)))
    assert torch.equal(value["cache"]["keys"][1], x - 1) and torch.equal(value["cache"]["values"][0], x * 3)


def test_an_unregistered_output_type_names_where_it_is():
    class Odd:
        pass

    class ReturnsOdd(torch.nn.Module):
        def forward(self, x):
            return (x, [x, Odd()])

    with pytest.raises(OpdiffError) as err:
        prepare_call({"a": ReturnsOdd()}, [torch.ones(2)], {}, "test 'odd'")
    assert str(err.value).startswith("test 'odd' returns a Odd as output[1][1], and torch.utils._pytree has no "
                                     "registration for ")
    assert str(err.value).endswith("Return tensors instead, or register the type with "
                                   "torch.utils._pytree.register_pytree_node where the module is defined.")


# ---------------------------------------------------------------- record and check, for real

def record_and_check(tmp_path: Path, test_id: str) -> None:
    settings = Settings(goldens=tmp_path / "goldens", store=tmp_path / "store", cache=tmp_path / "cache", jobs=1,
                        repeats=1, warmup=0)
    suites = [ZOO / "text.yaml", ZOO / "vision.yaml", ZOO / "audio.yaml"]
    recorded = api.record(api.RecordRequest(selection=api.Selection(suites=suites, test_ids=[test_id]),
                                            running=api.Running(in_process=True)), settings=settings)
    assert [(r.test_id, r.verdict) for r in recorded.results] == [(test_id, Verdict.RECORDED)]
    checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32", "onnx_cpu_fp32"],
                                         selection=api.Selection(suites=suites, test_ids=[test_id]),
                                         running=api.Running(in_process=True)), settings=settings)
    assert sorted((r.preset, r.verdict) for r in checked.results) == \
        [("onnx_cpu_fp32", Verdict.PASS), ("torch_cpu_fp32", Verdict.PASS)], [r.message for r in checked.results]


def test_a_zoo_decoder_records_and_checks_on_torch_and_onnx(tmp_path):
    record_and_check(tmp_path, "zoo_llama")


@pytest.mark.slow
def test_a_zoo_encoder_decoder_records_and_checks_on_torch_and_onnx(tmp_path):
    record_and_check(tmp_path, "zoo_t5")
