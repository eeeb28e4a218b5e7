"""Materialisation determinism and independence, every dtype, spec hash sensitivity."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from opdiff_snap.suite import load_suites
from opdiff_snap.suite.fields import DTYPES
from opdiff_snap.suite.materialize import materialize

FULL = Path(__file__).parent / "suites" / "full"


def flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in flat(v)]
    return [x]


def same(a, b) -> bool:
    fa, fb = flat(a), flat(b)
    return len(fa) == len(fb) and all(
        (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
         and x.shape == y.shape and torch.equal(x.view(torch.uint8) if x.dtype == torch.bfloat16 else x,
                                                y.view(torch.uint8) if y.dtype == torch.bfloat16 else y))
        or (not isinstance(x, torch.Tensor) and x == y) for x, y in zip(fa, fb))


@pytest.fixture(scope="module")
def cases():
    return load_suites([FULL / "main.yaml"])


def test_same_seed_bit_identical_other_seed_differs(cases):
    for c in cases:
        a, b = materialize(c, 0), materialize(c, 0)
        assert same(a.args, b.args) and same(a.kwargs, b.kwargs) and same(a.states, b.states), c.id
    c = next(c for c in cases if c.id == "common_add")
    assert not torch.equal(materialize(c, 0).args[0], materialize(c, 1).args[0])


def test_other_tests_do_not_matter(tmp_path):
    one = "tests:\n" + "".join(f"  - id: {n}\n    op: {{type: module, path: torch.nn.Linear, args: [3, 2]}}\n"
                               f"    in: [{{type: tensor, shape: [2, 3], kind: float}}]\n" for n in ("a", "b"))
    two = "tests:\n" + "".join(f"  - id: {n}\n    op: {{type: module, path: torch.nn.Linear, args: [3, 2]}}\n"
                               f"    in: [{{type: tensor, shape: [2, 3], kind: float}}]\n" for n in ("z", "b", "c"))
    (tmp_path / "one.yaml").write_text(one)
    (tmp_path / "two.yaml").write_text(two)
    b1 = next(c for c in load_suites([tmp_path / "one.yaml"]) if c.id == "b")
    b2 = next(c for c in load_suites([tmp_path / "two.yaml"]) if c.id == "b")
    torch.manual_seed(123)   # the global RNG state must not matter either
    i1 = materialize(b1, 0)
    torch.rand(7)
    i2 = materialize(b2, 0)
    assert same(i1.args, i2.args) and same(i1.states, i2.states)
    assert b1.spec_hash == b2.spec_hash


def test_pair_sides_get_identical_weights(cases):
    c = next(c for c in cases if c.id == "lin_pair__in_features=N__out_features=8")
    inv = materialize(c, 0)
    assert set(inv.states) == {"a", "b"}
    assert inv.states["a"].keys() == inv.states["b"].keys()
    assert all(torch.equal(inv.states["a"][k], inv.states["b"][k]) for k in inv.states["a"])
    assert "a" not in materialize(next(c for c in cases if c.call.kind == "op"), 0).states


def test_node_semantics(cases):
    by = {c.id: c for c in cases}
    inv = materialize(by["misc_nodes"], 0)
    st, ct, tup, three = inv.args
    assert st.shape == () and st.dtype == torch.float32
    assert torch.equal(ct, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert tup[0] == [1, 4, 2] and (tup[1] is None or isinstance(tup[1], bool)) and three == 3
    lst = materialize(by["every_node"], 0)
    assert len(lst.args[0]) == 3 and all(t.min() >= -1 and t.max() <= 1 for t in lst.args[0])
    assert lst.kwargs == {"dim": 0}
    fft = materialize(by["fft"], 0).args[0]
    assert fft.dtype == torch.float32 and fft.shape == (8, 2)           # complex travels as real [..., 2]
    x, s = materialize(by["mul_Tensor_0"], 0).args
    assert x.dtype == torch.float16 and isinstance(s, float) and -2 <= s <= 2
    inv = materialize(by["scaled"], 0)
    assert set(inv.states["a"]) == {"lin.weight", "lin.bias"}


def test_every_dtype_and_init(tmp_path):
    tests = []
    for dt in DTYPES:
        for init in ("normal", "uniform", "randint", "zeros", "ones", "bernoulli"):
            tests.append(f"  - id: {dt}_{init}\n    op: aten::clone\n"
                         f"    in: [{{type: tensor, shape: [64], dtype: {dt}, init: {init}}}]\n")
    tests.append("  - id: grad\n    op: aten::clone\n"
                 "    in: [{type: tensor, shape: [3], kind: float, requires_grad: true}]\n")
    tests.append("  - id: opt\n    op: aten::clone\n"
                 "    in: [{type: optional, p_none: 1, elem: {type: scalar, kind: int}},"
                 " {type: optional, elem: {type: scalar, kind: int}},"
                 " {type: scalar_tensor, dtype: int32, value: 5}]\n")
    (tmp_path / "d.yaml").write_text("tests:\n" + "".join(tests))
    by = {c.id: c for c in load_suites([tmp_path / "d.yaml"])}
    for dt in DTYPES:
        for init in ("normal", "uniform", "randint", "zeros", "ones", "bernoulli"):
            t = materialize(by[f"{dt}_{init}"], 0).args[0]
            assert t.dtype == getattr(torch, dt) and t.shape == (64,), (dt, init)
            if init == "zeros":
                assert not t.any()
            if init == "randint" and dt not in ("bool",) and not dt.startswith("complex"):
                assert t.to(torch.float64).min() >= 0 and t.to(torch.float64).max() <= 9
    assert materialize(by["float32_normal"], 0).args[0].std() > 0.5
    assert materialize(by["int64_randint"], 0).args[0].unique().numel() > 5
    assert materialize(by["complex64_normal"], 0).args[0].imag.abs().sum() > 0
    assert materialize(by["grad"], 0).args[0].requires_grad
    none, val, st = materialize(by["opt"], 0).args
    assert none is None and isinstance(val, int) and 0 <= val <= 9
    assert st.dtype == torch.int32 and st.item() == 5


def test_spec_hash_sensitivity(tmp_path):
    shutil.copytree(FULL, tmp_path / "s")
    main = tmp_path / "s" / "main.yaml"
    load = lambda: {c.id: c.spec_hash for c in load_suites([main])}
    base = load()
    assert len(set(base.values())) == len(base)
    text = main.read_text()
    main.write_text(text.replace("# every node type", "# a comment: every node type")
                        .replace("seeds: [3, 7]", "seeds: [1]"))   # comment and seeds: outputs unchanged
    assert load() == base
    main.write_text(text.replace("factor: 2.0", "factor: 3.0"))    # edit one test
    after = load()
    assert after["scaled"] != base["scaled"]
    assert {k for k in base if after[k] != base[k]} == {"scaled"}
    main.write_text(text)
    models = tmp_path / "s" / "models.py"
    models.write_text(models.read_text() + "\n# changed\n")         # edit the file module
    after = load()
    assert {k for k in base if after[k] != base[k]} == {
        "scaled", "lin_pair__in_features=N__out_features=8", "lin_pair__in_features=N__out_features=16"}
