"""Goldens brought in from elsewhere (a colleague's branch, a shared bucket, a CI
artifact) run nothing their author planted: a golden cannot name the suite that vouches
for it, and an ATen op named by a golden alone must be a pure tensor computation.

The planted store is made the way its author would make it: recorded with the real CLI
from the author's own suite, `../evil/suite.yaml`, whose `file:` module is then given a
payload (its spec hash recomputed, so nothing looks stale). The victim only has the
goldens folder, and runs `opdiff check` or `pytest --opdiff` on it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.cli import invoke
from helpers.hostile import FAST, MODELS, REPO, assert_clean_failure, edit_attrs, run_cli, snapshot
from helpers.pytest import make_site

from opdiff_snap.goldens import store_key
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.trust import code_paths, op_refusal, refusal

pytest_plugins = ["pytester"]

MARKER = "PLANTED_RAN"          # written beside the planted module when it is imported
GRABBED = "GRABBED"             # the file aten::from_file creates in the checking folder

EVIL_SUITE = f"""\
tests:
  - id: neg
    op: aten::neg
    in: [{{type: tensor, shape: [2, 3], dtype: float32, init: normal}}]
  - id: scale
    op: {{type: module, path: "file:models.py::Scale", args: [{{type: const, value: 3}}]}}
    in: [{{type: tensor, shape: [2, 3], dtype: float32, init: normal}}]
  - id: grab
    op: aten::from_file
    in: [{{type: const, value: {GRABBED}}}, {{type: const, value: true}}, {{type: const, value: 4}}]
  - id: noise
    op: aten::rand
    in: [{{type: int_list, elems: [2, 3]}}]
"""
PAYLOAD = f'''\
import pathlib

pathlib.Path(__file__).with_name("{MARKER}").write_text("imported from a golden's own suite")
'''
ALL = ("neg", "scale", "grab", "noise")


@pytest.fixture(scope="module")
def authored(tmp_path_factory) -> Path:
    """The author's folder: evil/ (suite and module) and p/goldens, recorded from p with
    `opdiff record ../evil/suite.yaml`, then the payload added to the module and the
    `scale` golden's spec hash recomputed to match it."""
    root = tmp_path_factory.mktemp("authored")
    evil, project = root / "evil", root / "p"
    evil.mkdir()
    project.mkdir()
    (evil / "suite.yaml").write_text(EVIL_SUITE)
    (evil / "models.py").write_text(MODELS)
    proc = run_cli(project, "record", "../evil/suite.yaml", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (evil / "models.py").write_text(PAYLOAD + MODELS)
    spec = {c.id: c.spec_hash for c in load_suites([evil / "suite.yaml"])}["scale"]
    edit_attrs(project, "scale", lambda attrs: attrs.update(spec_hash=spec))
    (project / GRABBED).unlink()         # made when the author recorded it
    shutil.rmtree(project / "store")     # the victim gets the goldens only
    return root


def plant(authored: Path, victim: Path, evil: Path, *test_ids: str) -> Path:
    """The goldens of `test_ids` in victim/goldens and the author's files in `evil`, the
    goldens' recorded suite path pointing there from the victim's folder."""
    victim.mkdir(parents=True, exist_ok=True)
    shutil.copytree(authored / "evil", evil)
    shutil.copytree(authored / "p" / "goldens", victim / "goldens")
    for test_id in ALL:
        if test_id not in test_ids:
            shutil.rmtree(victim / "goldens" / store_key(test_id, 0))
    suite = os.path.relpath(evil / "suite.yaml", victim)
    for test_id in test_ids:
        edit_attrs(victim, test_id, lambda attrs: attrs.update(suite=suite))
    return victim


def ran_nothing(victim: Path, evil: Path) -> None:
    assert not (evil / MARKER).exists(), "the planted module was imported"
    assert not (victim / GRABBED).exists(), "aten::from_file ran"
    runs = victim / "store" / "runs"
    assert not runs.exists() or not list(runs.iterdir()), "a run was started"


# ---------------------------------------------------------------- a golden cannot vouch for itself

def test_a_golden_cannot_name_the_suite_that_vouches_for_it(authored, tmp_path):
    victim = plant(authored, tmp_path / "p", tmp_path / "evil", "scale")
    assert json.loads((victim / "goldens" / store_key("scale", 0) / "zarr.json").read_text()
                      )["attributes"]["suite"] == "../evil/suite.yaml"
    before = snapshot(tmp_path)
    proc = run_cli(victim, "check", "-b", "torch_cpu_fp32", *FAST)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, "'scale' seed 0: file:models.py::Scale")
    assert "no suite given vouches for it" in proc.stderr and "--suites" in proc.stderr
    ran_nothing(victim, tmp_path / "evil")
    # the other commands that rebuild a test from a golden refuse it the same way
    for command in (("repro", "scale", "-b", "torch_cpu_fp32", "-o", "r.py"),
                    ("localize", "scale", "-b", "torch_cpu_fp32", "-j", "1"),
                    ("goldens", "reference", "--force", "-j", "1")):
        code, out, err = invoke(victim, *command)
        assert "file:models.py::Scale" in out + err and code != 0, (command, out + err)
        assert "Traceback" not in out + err
    ran_nothing(victim, tmp_path / "evil")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_the_pytest_plugin_runs_no_code_a_golden_names(authored, tmp_path, pytester, monkeypatch):
    """The same store under `pytest --opdiff`: collection refuses it, naming the golden."""
    site = make_site(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(REPO)]))
    victim = plant(authored, pytester.path, tmp_path / "evil", "scale")
    result = pytester.runpytest_subprocess("--opdiff", "-b", "torch_cpu_fp32", "-p", "no:cacheprovider")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, text
    assert "opdiff: error:" in text and "'scale' seed 0: file:models.py::Scale" in text, text
    assert "Traceback" not in text
    ran_nothing(victim, tmp_path / "evil")


# ---------------------------------------------------------------- ops with effects

@pytest.mark.parametrize("test_id, why", [
    ("grab", "aten::from_file (overload 'default': makes a tensor from its string argument 'filename'"),
    ("noise", "aten::rand (overload 'default': draws on the random number generator"),
])
def test_a_golden_naming_an_op_with_effects_runs_nothing(authored, tmp_path, test_id, why):
    victim = plant(authored, tmp_path / "p", tmp_path / "evil", test_id, "neg")
    before = snapshot(tmp_path)
    proc = run_cli(victim, "check", "-b", "torch_cpu_fp32", *FAST)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, f"'{test_id}' seed 0: {why}")
    assert "'neg'" not in proc.stderr        # the pure op is not named
    ran_nothing(victim, tmp_path / "evil")
    assert snapshot(tmp_path) == before
    # the pure op of the same store still runs from the golden alone
    proc = run_cli(victim, "check", "-b", "torch_cpu_fp32", "--test-ids", "neg", "--format", "json", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["status"] for r in json.loads(proc.stdout)["results"]] == ["PASS"]


REFUSED = [
    ("aten::from_file", "overload 'default': makes a tensor from its string argument 'filename'"),
    ("aten::from_file.out", "makes a tensor from its string argument 'filename'"),
    ("aten::manual_seed", "overload 'default': returns nothing: it runs only for its effect"),
    ("aten::seed", "overload 'default': takes a random number generator, 'self'"),
    ("aten::rand", "draws on the random number generator: it is tagged nondeterministic_seeded"),
    ("aten::bernoulli.p", "draws on the random number generator: it is tagged nondeterministic_seeded"),
    ("aten::dropout.default", "draws on the random number generator: it is tagged nondeterministic_seeded"),
    ("aten::_print", "returns nothing: it runs only for its effect"),
    ("aten::save", "returns nothing: it runs only for its effect"),
    ("aten::_assert_async.default", "returns nothing: it runs only for its effect"),
    ("aten::set_grad_enabled", "returns nothing: it runs only for its effect"),
    ("aten::add_.Tensor", "writes to its argument 'self'"),
    ("aten::resize_.default", "writes to its argument 'self'"),
    ("aten::set.source_Storage", "the argument 'source' is a Storage, not tensor data"),
    ("aten::wait", "the argument 'self' is a Future, not tensor data"),
    ("aten::Generator", "the result is a Generator, not tensor data"),
    ("aten::__setattr__", "here has no operator aten::__setattr__ to inspect"),
    ("aten::name", "here has no operator aten::name to inspect"),
    ("aten::add.__init__", "here has no overload aten::add.__init__ to inspect"),
    ("aten::no_such_op", "here has no operator aten::no_such_op to inspect"),
    ("prims::add", "namespace 'prims' is not ATen's"),
]


@pytest.mark.parametrize("name, why", REFUSED, ids=[n for n, _ in REFUSED])
def test_ops_with_effects_are_refused_by_their_schema(name, why):
    assert why in (op_refusal(name) or ""), op_refusal(name)


# overload packets (torch picks the overload at call time) whose every overload is pure,
# factories that build a tensor from numbers only, and ops taking a str that is a mode
PURE = ["aten::neg", "aten::relu", "aten::add", "aten::div", "aten::eq", "aten::full", "aten::arange",
        "aten::scalar_tensor", "aten::einsum", "aten::gelu", "aten::div.Tensor_mode", "aten::sort.stable",
        "aten::add.out"]


@pytest.mark.parametrize("name", PURE)
def test_pure_ops_are_accepted(name):
    assert op_refusal(name) is None


def test_every_op_and_class_the_shipped_suites_name_may_come_from_a_golden():
    """What the project's own suites name passes the rules (their file: modules aside,
    which are user code)."""
    cases = load_suites(sorted((REPO / "suites").glob("*.yaml")))
    paths = {p for c in cases for p in code_paths(c.definition) if not p.startswith("file:")}
    assert len(paths) > 200
    refused = {p: refusal(p) for p in sorted(paths) if refusal(p) is not None}
    assert not refused


# ---------------------------------------------------------------- files a golden's definition names

def test_the_spec_hash_reads_only_regular_files(tmp_path):
    """A golden's definition chooses which `file:` paths the spec hash reads: a device
    that never ends or a FIFO that never opens hashes as a marker (the golden is then
    stale), instead of a read that never returns."""
    import threading

    from opdiff_snap.suite.spechash import spec_hash

    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    real = tmp_path / "real.py"
    real.write_text("x = 1\n")
    out: dict[str, str] = {}
    worker = threading.Thread(target=lambda: out.update(
        dev=spec_hash({"op": "x"}, (Path("/dev/zero"),)), fifo=spec_hash({"op": "x"}, (fifo,)),
        folder=spec_hash({"op": "x"}, (tmp_path,)), real=spec_hash({"op": "x"}, (real,))), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "hashing a device or a FIFO did not return"
    assert out["dev"] == out["fifo"] == out["folder"] != out["real"]
