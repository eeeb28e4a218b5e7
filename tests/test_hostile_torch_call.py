"""A TorchCall calls torch's operator functions and Tensor methods only: a suite naming
anything else (a module torch imports, a loader, a saver, a file reader, a hub, an
extension builder, a dunder) is refused by `validate`, the worker refuses it again when
the module is built, and a golden alone may name a TorchCall whose function passes, so
the shipped OpInfo goldens check without their suites."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.check import copy_shipped
from helpers.hostile import FAST, REPO, assert_clean_failure, edit_attrs, run_cli

from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.spechash import spec_hash
from opdiff_snap.suite.torch_call import TorchCall, resolve_fn
from opdiff_snap.suite.trust import untrusted_paths

PWNED = "PWNED"
HOSTILE = {
    "system": ("torch.os.system", f'["touch {PWNED}"]'),
    "exec": ("torch.builtins.exec", f'["open(\'{PWNED}\', \'w\')"]'),
    "importer": ("torch.importlib.import_module", '["this"]'),
    "hub": ("torch.hub.load", '[".", "entry", {source: local}]'),
    "inline": ("torch.utils.cpp_extension.load_inline", '["x", ""]'),
    "save": ("torch.save", f'[{{input: 0}}, "{PWNED}"]'),
    "load": ("torch.load", f'["{PWNED}"]'),
    "from_file": ("torch.from_file", f'["{PWNED}", true, 4]'),
    "reduce": ("Tensor.__reduce_ex__", "[{input: 0}, 2]"),
    "setattr": ("Tensor.__setattr__", '[{input: 0}, "x", 1]'),
    "aten_file": ("torch.ops.aten.from_file", f'["{PWNED}", true, 4]'),
    "threads": ("torch.set_num_threads", "[1]"),
}


def hostile_suite() -> str:
    lines = ["tests:"]
    for test_id, (fn, args) in HOSTILE.items():
        lines += [f"  - id: {test_id}",
                  f"    op: {{type: module, path: opdiff_snap.suite.torch_call.TorchCall, kwargs: {{fn: {fn}, "
                  f"args: {args}}}}}",
                  "    in: [{type: tensor, shape: [2], dtype: float32}]"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("imports", [False, True], ids=["validate", "validate --imports"])
def test_validate_refuses_every_function_that_is_not_an_operator(tmp_path, imports):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "evil.yaml").write_text(hostile_suite())
    proc = run_cli(tmp_path, "validate", *(["--imports"] if imports else []))
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, f"{len(HOSTILE)} problems in suite input")
    for test_id in HOSTILE:
        assert f"test '{test_id}'" in proc.stderr
    assert "A TorchCall calls only torch's operator functions and Tensor methods" in proc.stderr
    assert not (tmp_path / PWNED).exists()


@pytest.mark.parametrize("fn", [fn for fn, _ in HOSTILE.values()])
def test_the_worker_refuses_them_again(fn):
    with pytest.raises(OpdiffError, match="A TorchCall calls only torch's operator functions"):
        resolve_fn(fn)
    with pytest.raises(OpdiffError):
        TorchCall(fn, [{"input": 0}])


def test_an_aten_op_packet_or_overload_may_be_called_and_another_namespace_may_not():
    import torch

    assert resolve_fn("torch.ops.aten.add") is torch.ops.aten.add
    assert resolve_fn("torch.ops.aten.add.Tensor") is torch.ops.aten.add.Tensor
    assert resolve_fn("torch.ops.aten._flash_attention_forward") is torch.ops.aten._flash_attention_forward
    with pytest.raises(OpdiffError):
        resolve_fn("torch.ops.prims.add")


def test_what_the_shipped_suites_call_passes():
    """Every function the shipped suites' TorchCalls name (the OpInfo suites' 490-odd) passes
    the rule, so their goldens are data a golden alone may name."""
    suites = sorted((REPO / "suites").glob("*.yaml")) + sorted((REPO / "suites" / "opinfo").glob("*.yaml"))
    cases = load_suites(suites)
    calls = [c for c in cases if c.call.target.endswith("TorchCall")]
    assert len(calls) > 1000
    for case in calls:
        resolve_fn(case.call.kwargs["fn"]["value"])
    assert not {p for c in cases for p in untrusted_paths(c.definition) if not p.startswith("file:")}


def _goldens_only(tmp_path: Path, *test_ids: str) -> Path:
    project = tmp_path / "p"
    assert len(copy_shipped(project / "goldens", lambda info: info.seed == 0 and info.test_id in test_ids)) \
        == len(test_ids)
    (project / "suites").mkdir()          # no suite vouches for anything
    return project


def test_shipped_opinfo_goldens_check_from_the_goldens_alone(tmp_path):
    ids = ("opinfo.add.f32.0", "opinfo.add.f32.1", "opinfo.nn.functional.relu.f32.2", "opinfo.exp.f16.0",
           "opinfo.exp.f32.0@subnormal")
    project = _goldens_only(tmp_path, *ids)
    proc = run_cli(project, "check", "-b", "torch_cpu_fp32", "--format", "json", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["status"] for r in json.loads(proc.stdout)["results"]] == ["PASS"] * len(ids)


def test_an_edited_torch_call_golden_is_refused_and_named(tmp_path):
    project = _goldens_only(tmp_path, "opinfo.add.f32.0")

    def evil(attrs):   # as its author would: the call changed, the spec hash made to match
        kwargs = attrs["definition"]["call"]["kwargs"]
        kwargs["fn"]["value"] = "torch.os.system"
        kwargs["args"]["value"] = [f"touch {PWNED}"]
        attrs["spec_hash"] = spec_hash(attrs["definition"], ())

    edit_attrs(project, "opinfo.add.f32.0", evil)
    proc = run_cli(project, "check", "-b", "torch_cpu_fp32", *FAST)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2,
                         "opdiff_snap.suite.torch_call.TorchCall(torch.os.system) ('torch.os' is not one of "
                         "torch's operator namespaces")
    assert not (project / PWNED).exists()
    # --trust-goldens names the function it lets through, and the worker still refuses to call it
    proc = run_cli(project, "check", "-b", "torch_cpu_fp32", "--trust-goldens", *FAST)
    assert "import opdiff_snap.suite.torch_call.TorchCall(torch.os.system)" in proc.stdout, proc.stdout
    assert "1 EXPORT_FAIL" in proc.stdout
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    assert not (project / PWNED).exists()
