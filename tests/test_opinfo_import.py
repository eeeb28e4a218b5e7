"""`opdiff import opinfo`: torch's OpInfo samples written as TorchCall tests, the same
files on every run, every kept sample rebuilt exactly by the suite loader and recorded
and checked for real; the TorchCall form and its errors."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers.cli import MODULE, run

from opdiff_snap import api
from opdiff_snap.cli import main
from opdiff_snap.compare.vacuous import vacuous_reason
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.importers.yamlwrite import yaml_float
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.construct import build_modules
from opdiff_snap.suite.materialize import materialize
from opdiff_snap.suite.torch_call import TorchCall

OPS = ["add", "cat", "nn.functional.conv2d", "fft.ifft", "empty_like", "nn.functional.dropout",
       "nn.functional.linear", "where"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    root = tmp_path_factory.mktemp("oi")
    first = api.import_opinfo(root / "a", ops=OPS, dtypes=("float32", "float16"), max_samples=2)
    second = api.import_opinfo(root / "b", ops=OPS, dtypes=("float32", "float16"), max_samples=2)
    return root, first, second


def test_import_is_deterministic_and_says_why_it_skipped(imported):
    root, first, second = imported
    names = sorted(p.name for p in (root / "a").glob("*.yaml"))
    assert names == sorted(p.name for p in (root / "b").glob("*.yaml"))
    for name in names:
        assert (root / "a" / name).read_bytes() == (root / "b" / name).read_bytes(), name
    rows = {r.name: r for r in first.rows}
    assert rows["empty_like"].reason == "its output is uninitialised memory"
    assert not sum(rows["empty_like"].kept.values())
    assert rows["add"].kept == {"float32": 2, "float16": 2}
    assert rows["add"].fn == "torch.add"
    assert first.samples == sum(sum(r.kept.values()) for r in first.rows) > 10
    # dropout's samples draw on the random number generator: never a test
    assert not sum(rows["nn.functional.dropout"].kept.values())


def test_every_written_test_rebuilds_its_inputs_and_runs(imported):
    root, first, _ = imported
    cases = load_suites(sorted((root / "a").glob("*.yaml")))
    assert len(cases) == first.samples
    for case in cases:
        assert case.tags[0] == "opinfo" and case.call.target.endswith("TorchCall")
        inv = materialize(case, 0)
        again = materialize(case, 0)
        assert all(torch.equal(x, y) for x, y in zip(inv.args, again.args))


@pytest.mark.slow
def test_imported_tests_record_and_check_on_torch(imported, tmp_path):
    root, first, _ = imported
    project = tmp_path / "p"
    (project / "suites").mkdir(parents=True)
    for f in (root / "a").glob("*.yaml"):
        (project / "suites" / f.name).write_bytes(f.read_bytes())
    settings = Settings(repeats=1, warmup=0)
    with contextlib.chdir(project):
        recorded = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        assert recorded.counts() == {"RECORDED": first.samples}
        checked = api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True)),
                                             settings=settings)
    assert checked.counts() == {"PASS": first.samples}


def test_cli_refuses_unknown_ops_and_dtypes(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["import", "opinfo", "--ops", "no_such_op_*", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "no OpInfo entry matches" in res.output
    res = runner.invoke(main, ["import", "opinfo", "--ops", "add", "--dtypes", "float8", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "'float8' is not one of" in res.output
    assert not list(tmp_path.glob("**/*.yaml"))


def test_elementwise_ops_get_the_edge_profiles_asked_for_and_others_none(tmp_path):
    """--profiles edge: each sample of a unary or binary ufunc (exp, add) is also a golden on
    every edge profile, with its own inputs rewritten; a matmul's samples stay as they are;
    an unknown profile is refused before anything is written."""
    from opdiff_snap.suite.profiles import EDGE

    report = api.import_opinfo(tmp_path / "o", ops=["exp", "add", "mm"], profiles=["edge"])
    ids = [c.id for c in load_suites(report.files)]
    base = "opinfo.exp.f32.0"
    # each profile in float32's values, and in fp16's and bf16's (docs/suite-format.md)
    each = [f"{p}{v}" for p in EDGE for v in ("", ".f16", ".bf16")]
    assert [i for i in ids if i.startswith(base)] == [base, *(f"{base}@{p}" for p in each)]
    # add's second sample keeps the profiles whose goldens say something (its subnormal sums
    # are all within atol of zero)
    add = [i for i in ids if i.startswith("opinfo.add.f32.1")]
    assert add[0] == "opinfo.add.f32.1" and 1 < len(add) < 1 + len(each)
    assert add[1:] == [f"opinfo.add.f32.1@{p}" for p in each if f"opinfo.add.f32.1@{p}" in add]
    assert [i for i in ids if i.startswith("opinfo.mm.")] == ["opinfo.mm.f32.0", "opinfo.mm.f32.1"]
    assert "input profiles wide, subnormal" in report.files[0].read_text()
    cases = {c.id: c for c in load_suites(report.files)}
    normal, subnormal = (materialize(cases[i], 0).args[0] for i in ("opinfo.exp.f32.0", "opinfo.exp.f32.0@subnormal"))
    assert normal.shape == subnormal.shape and not torch.equal(normal, subnormal)
    assert (subnormal.abs() < torch.finfo(torch.float32).tiny).any()
    res = CliRunner().invoke(main, ["import", "opinfo", "--ops", "exp", "--profiles", "huge",
                                    "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "'huge' is not an input profile" in res.output
    assert not (tmp_path / "p").exists()


def test_the_same_files_whatever_the_interpreters_string_hash_seed(tmp_path):
    """OpInfo draws meshgrid's samples from a set of strings, ordered by the interpreter's
    hash seed; imports from interpreters that order that set differently write the same file."""
    orders, texts = set(), []
    for seed in ("0", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        probe = subprocess.run([sys.executable, "-c", "print(list({'xy', 'ij'}))"], env=env,
                               capture_output=True, text=True, check=True)
        orders.add(probe.stdout)
        out = tmp_path / seed
        proc = run(None, "import", "opinfo", "--ops", "meshgrid.list_of_tensors", "--out", str(out), entry=MODULE,
                   env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        texts.append((out / "torch.m.yaml").read_text())
    assert len(orders) == 2, "the two seeds must order the set differently for this to test anything"
    assert texts[0] == texts[1]
    # a Python that ignores PYTHONHASHSEED (-E) cannot give that: refused, not a chain of children
    proc = subprocess.run([sys.executable, "-E", "-m", "opdiff_snap.cli", "import", "opinfo", "--ops", "add",
                           "--out", str(tmp_path / "e")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "ignores PYTHONHASHSEED" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "e").exists()


def test_samples_and_profiles_whose_golden_would_prove_nothing_are_left_out(tmp_path):
    """eq's first samples are all False and relu's first all zeros: the next samples are
    taken instead; an edge profile whose outputs say nothing (relu of subnormals: zeros) is
    left out of its sample's profiles; float16 samples get no profiles where
    --profile-dtypes names float32 only; the report counts what was left out and why."""
    report = api.import_opinfo(tmp_path / "o", ops=["eq", "nn.functional.relu", "exp"],
                               dtypes=["float32", "float16"], profiles=["edge"], profile_dtypes=["float32"])
    cases = load_suites(report.files)
    for case in cases:
        out = build_modules(case)["a"](*materialize(case, 0).args)
        assert vacuous_reason(out) is None, case.id
    ids = [c.id for c in cases]
    rows = {r.name: r for r in report.rows}
    assert rows["eq"].kept["float32"] >= 1 and "opinfo.eq.f32.0" not in ids
    assert rows["nn.functional.relu"].kept == {"float32": 2, "float16": 2}
    assert any("@" in i for i in ids) and not any(".f16." in i and "@" in i for i in ids)
    reasons = report.skip_reasons()
    assert reasons["sample: its golden would prove nothing (outputs all near zero, all NaN/Inf, "
                   "or one repeated value)"] >= 2
    assert sum(rows["nn.functional.relu"].dropped_profiles.values()) >= 1
    assert any(k.endswith("profile of a sample: its golden would prove nothing (outputs all near zero, "
                          "all NaN/Inf, or one repeated value)") for k in reasons)
    assert "the elementwise ops' float32 samples also on the input profiles" in report.files[0].read_text()
    res = CliRunner().invoke(main, ["import", "opinfo", "--ops", "exp", "--profiles", "edge",
                                    "--profile-dtypes", "bfloat16", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "--profile-dtypes bfloat16" in res.output
    res = CliRunner().invoke(main, ["import", "opinfo", "--ops", "exp", "--profile-dtypes", "float32",
                                    "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "without --profiles does nothing" in res.output
    assert not (tmp_path / "p").exists()
    # a relative --out is the caller's, wherever the import runs
    with contextlib.chdir(tmp_path):
        api.import_opinfo(Path("rel"), ops=["exp"])
    assert (tmp_path / "rel" / "torch.e.yaml").is_file()


def test_import_replaces_only_what_it_wrote(tmp_path):
    """Hand-written suites in --out stay; an earlier import's files are replaced; a hand-written
    file where the import would write, an empty --dtypes, and an --out that is (or lies under)
    a file are refused with exit 2 before anything is written or removed."""
    runner = CliRunner()
    suites = tmp_path / "suites"
    suites.mkdir()
    hand = {"core_aten.yaml": "tests:\n  - {id: abs, op: aten::abs, in: [{type: tensor, shape: [2], kind: float}]}\n",
            "models.yaml": "tests: []\n"}
    for name, text in hand.items():
        (suites / name).write_text(text)
    res = runner.invoke(main, ["import", "opinfo", "--ops", "add", "--out", str(suites)])
    assert res.exit_code == 0, res.output
    assert {n: (suites / n).read_text() for n in hand} == hand
    assert (suites / "torch.a.yaml").read_text().startswith("# Generated by `opdiff import opinfo`")
    res = runner.invoke(main, ["import", "opinfo", "--ops", "cat", "--out", str(suites)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in suites.glob("*.yaml")) == ["core_aten.yaml", "models.yaml", "torch.c.yaml"]

    before = {p.name: p.read_bytes() for p in suites.iterdir()}
    for dtypes in ("", ",,"):
        res = runner.invoke(main, ["import", "opinfo", "--ops", "cat", "--dtypes", dtypes, "--out", str(suites)])
        assert res.exit_code == 2 and "--dtypes names no dtype" in res.output, res.output
    (suites / "torch.a.yaml").write_text("tests: []\n")      # hand-written, where add would go
    res = runner.invoke(main, ["import", "opinfo", "--ops", "add", "--out", str(suites)])
    assert res.exit_code == 2 and "torch.a.yaml, which `opdiff import opinfo` did not write" in res.output
    assert (suites / "torch.a.yaml").read_text() == "tests: []\n"
    (suites / "torch.a.yaml").unlink()
    assert {p.name: p.read_bytes() for p in suites.iterdir()} == before

    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, says in ((afile, "is a file"), (afile / "sub", "lies under")):
        res = runner.invoke(main, ["import", "opinfo", "--ops", "add", "--out", str(out)])
        assert res.exit_code == 2 and f"--out '{out}' {says}" in res.output, res.output
        assert "Traceback" not in res.output
    assert afile.read_text() == "x"


def test_floats_are_written_shortest_and_read_back_exactly():
    import numpy as np
    import yaml

    for dtype, values in ((np.float32, [1e-30, 3.0e-5, 0.1, -2.5, 1e16, 3.4e38, -0.0, 7.0]),
                          (np.float16, [6e-8, 3.0e-5, 0.1, -2.5, 65504.0, -0.0, 7.0])):
        for v in np.array(values, dtype=dtype):
            text = yaml_float(v)
            back = dtype(yaml.safe_load(text))
            assert isinstance(yaml.safe_load(text), float), text
            assert back.tobytes() == v.tobytes(), (text, v)
    assert [yaml_float(x) for x in (float("nan"), float("inf"), -float("inf"))] == [".nan", ".inf", "-.inf"]


# ---------------------------------------------------------------- the TorchCall form

def test_torch_call_places_inputs_and_values():
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    call = TorchCall("torch.nn.functional.linear", args=[{"input": 0}, {"input": 1}])
    assert torch.equal(call(x, w), torch.nn.functional.linear(x, w))
    summed = TorchCall("Tensor.sum", args=[{"input": 0}], kwargs={"dim": [1], "dtype": {"dtype": "float64"}})
    assert summed(x).dtype == torch.float64
    cat = TorchCall("torch.cat", args=[[{"input": 0}, {"input": 1}]], kwargs={"dim": 0})
    assert cat(x, w).shape == (6, 3)
    filled = TorchCall("torch.full_like", args=[{"input": 0}, {"float": "-inf"}])
    assert torch.isneginf(filled(x)).all()


@pytest.mark.parametrize("fn, args, kwargs, says", [
    ("os.system", [], {}, "'os' is not one of torch's operator namespaces"),
    ("Tensor.no_such_method", [], {}, "Tensor.no_such_method does not exist in torch"),
    ("torch.add", [{"input": 0}, {"tensor": 1}], {}, "is not an argument form"),
    ("torch.add", [{"input": 0}], {"out": {"dtype": "float99"}}, "torch has no dtype 'float99'"),
    ("torch.add", [{"input": "a"}], {}, "names no input"),
])
def test_torch_call_refuses_what_it_cannot_mean(fn, args, kwargs, says):
    with pytest.raises(OpdiffError) as err:
        TorchCall(fn, args=args, kwargs=kwargs)
    assert says in str(err.value)


def test_an_empty_tensor_is_written_as_an_empty_list(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "tests:\n"
        "  - id: empty\n"
        "    op: {type: module, path: opdiff_snap.suite.torch_call.TorchCall,\n"
        "         kwargs: {fn: torch.sum, args: [{input: 0}], kwargs: {dim: 1}}}\n"
        "    in: [{type: const_tensor, shape: [0, 3], dtype: float32, value: []}]\n"
        "  - id: not_empty\n"
        "    op: aten::abs.default\n"
        "    in: [{type: const_tensor, shape: [2, 3], dtype: float32, value: []}]\n")
    with pytest.raises(OpdiffError) as err:
        load_suites([suite])
    assert "test 'not_empty'" in str(err.value) and "value has shape [0] but shape is [2, 3]" in str(err.value)
    suite.write_text(suite.read_text().split("  - id: not_empty")[0])
    (case,) = load_suites([suite])
    assert materialize(case, 0).args[0].shape == (0, 3)

