"""Dynamic shapes: a test with `dynamic: {B: [...]}` records one golden per size, and a
check exports one artifact with B dynamic and runs every size on it; a preset that
exports static shapes only skips them with the reason, an int8 preset quantizes once
and judges each size against its quantized model run at that size, and a model that
branches on the size is refused by one exporter and caught running the wrong branch on
another."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from helpers.numerics import x86_int8_saturates

from opdiff_snap import api
from opdiff_snap.cause.reproduce import reproduce
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.materialize import materialize

SUITE = """
dims: {B: 4, N: 16, S: 6}
tests:
  - id: lin
    op: {type: module, path: torch.nn.Linear, args: [16, 8]}
    in: [{type: tensor, shape: [B, N], dtype: float32}]
    dynamic: {B: [2, 9]}
  - id: addmm
    op: aten::addmm.default
    in: [{type: tensor, shape: [B, 5], dtype: float32}, {type: tensor, shape: [B, S], dtype: float32},
         {type: tensor, shape: [S, 5], dtype: float32}]
    dynamic: {B: [3, 7], S: [2, 5]}
  - id: branchy
    op: {type: module, path: "file:branchy.py::Branchy"}
    in: [{type: tensor, shape: [B, 3], dtype: float32}]
    dynamic: {B: [2, 9]}
"""

BRANCHY = """
import torch
from helpers.numerics import x86_int8_saturates


class Branchy(torch.nn.Module):
    def forward(self, x):
        # a branch on the size: eager runs every size, an export for a range of sizes cannot
        return x * 2 if x.shape[0] > 3 else x * 3
"""


def _suite(root: Path, text: str = SUITE) -> Path:
    (root / "suites").mkdir(parents=True, exist_ok=True)
    (root / "suites" / "branchy.py").write_text(BRANCHY)
    (root / "suites" / "windows.py").write_text(WINDOWS_PY)
    path = root / "suites" / "dyn.yaml"
    path.write_text(text)
    return path


def _cases(root: Path, text: str = SUITE) -> dict:
    return {c.id: c for c in load_suites([_suite(root, text)])}


def test_each_size_is_a_test_of_its_own_with_the_weights_of_the_test_it_sizes(tmp_path):
    cases = _cases(tmp_path)
    assert list(cases) == ["lin", "lin@B=2", "lin@B=9", "addmm", "addmm@B=3_S=2", "addmm@B=7_S=5",
                           "branchy", "branchy@B=2", "branchy@B=9"]
    assert cases["lin"].dynamic is None                       # the test itself stays static
    assert cases["lin@B=9"].dynamic == {"dims": {"B": [2, 9]}, "at": {"B": 9}}
    assert "dynamic" in cases["lin@B=9"].tags and "dynamic" not in cases["lin"].tags   # --tags dynamic
    static, small, big = (materialize(cases[i], 0) for i in ("lin", "lin@B=2", "lin@B=9"))
    assert [tuple(x.args[0].shape) for x in (static, small, big)] == [(4, 16), (2, 16), (9, 16)]
    for sized in (small, big):
        assert all(torch.equal(sized.states["a"][k], v) for k, v in static.states["a"].items())
    # the axes each dim sizes are marked on the inputs, shared where a dim is shared
    inputs = cases["addmm@B=7_S=5"].definition["inputs"]
    assert [n.get("dynamic") for n in inputs] == [{"0": "B"}, {"0": "B", "1": "S"}, {"0": "S"}]
    plain = _cases(tmp_path / "plain", SUITE.replace("    dynamic: {B: [2, 9]}\n", "", 1))
    assert plain["lin"].spec_hash == cases["lin"].spec_hash   # adding sizes leaves the test's golden valid


@pytest.mark.parametrize("field, fragment", [
    ("dynamic: {B: [1, 9]}", "size 1 is below 2"),
    ("dynamic: {Q: [2, 9]}", "'Q' is not a dim of this suite"),
    ("dynamic: {B: [2, 9], S: [3]}", "must have one length"),
    ("dynamic: {B: [2, 9], S: [2, 9]}", "have the same sizes"),
    ("dynamic: {B: [2, 2]}", "repeat a size"),
    ("dynamic: [B]", "dynamic must map dim symbols"),
    ("dynamic: {B: {sizes: [4, 6], multiple_of: 4}}", "size 6 is not a multiple of 4"),
    ("dynamic: {B: {sizes: [4, 8], multiple_of: 4}}", "size 4 is not a multiple of 4 that is at least 8"),
    ("dynamic: {B: {sizes: [4, 8], step: 4}}", "multiple_of a whole number"),
    ("dynamic: {B: {sizes: [4, 8], multiple_of: 1}}", "multiple_of a whole number"),
])
def test_a_bad_dynamic_field_is_a_suite_problem_at_its_line(tmp_path, field, fragment):
    with pytest.raises(OpdiffError) as err:
        _cases(tmp_path, SUITE.replace("dynamic: {B: [2, 9]}", field, 1))
    assert fragment in str(err.value) and "dyn.yaml:7" in str(err.value) and "test 'lin'" in str(err.value)


def test_a_dynamic_dim_used_beyond_input_shapes_is_refused_with_the_place(tmp_path):
    text = SUITE + """
  - id: cat
    op: aten::cat.default
    in: [{type: list, len: B, elem: {type: tensor, shape: [B], dtype: float32}}]
    dynamic: {B: [2, 9]}
"""
    with pytest.raises(OpdiffError) as err:
        _cases(tmp_path, text)
    assert "test 'cat'" in str(err.value) and "inputs[0].len" in str(err.value)
    assert "may size input tensors only" in str(err.value)


WINDOWS = """
dims: {H: 16, W: 24}
tests:
  - id: windows
    op: {type: module, path: "file:windows.py::Windows"}
    in: [{type: tensor, shape: [1, 2, H, W], dtype: float32}]
    dynamic: {H: {sizes: [16, 24], multiple_of: 8}, W: {sizes: [24, 16], multiple_of: 8}}
"""

WINDOWS_PY = """
import torch


class Windows(torch.nn.Module):
    def forward(self, x):
        # the mean of each 8 x 8 window: defined only where H and W are multiples of 8
        b, c, h, w = x.shape
        return x.reshape(b, c, h // 8, 8, w // 8, 8).mean(dim=(3, 5))
"""


@pytest.mark.slow
def test_a_dim_declared_a_multiple_of_a_step_exports_once_where_a_plain_range_cannot(tmp_path):
    """A model that needs its sizes to be multiples of a window (Swin) exports for the range
    only when the dim says so; then one artifact serves both sizes on ONNX Runtime and
    ExecuTorch. Without the step, torch.export refuses the range (its guard H % 8 == 0)."""
    root = tmp_path / "p"
    _suite(root, WINDOWS)
    cases = {c.id: c for c in load_suites([root / "suites" / "dyn.yaml"])}
    assert cases["windows@H=24_W=16"].dynamic["steps"] == {"H": 8, "W": 8}
    plain = _cases(tmp_path / "plain", WINDOWS.replace(
        "{H: {sizes: [16, 24], multiple_of: 8}, W: {sizes: [24, 16], multiple_of: 8}}", "{H: [16, 24], W: [24, 16]}"))
    assert "steps" not in plain["windows@H=24_W=16"].dynamic            # no step: the definition as before
    assert plain["windows@H=24_W=16"].spec_hash != cases["windows@H=24_W=16"].spec_hash
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0, batch=1)
    presets = ["onnx_cpu_fp32", "executorch_cpu_fp32"]
    with contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        checked = api.check(api.CheckRequest(backends=presets, running=api.Running(in_process=True)),
                            settings=settings)
    got = {(r.test_id, r.preset): r for r in checked.results}
    for preset in presets:
        sized = [got[t, preset] for t in ("windows@H=16_W=24", "windows@H=24_W=16")]
        assert [r.verdict for r in sized] == [Verdict.PASS, Verdict.PASS], [(r.verdict, r.message) for r in sized]
        assert sorted(r.cache_hit for r in sized) == [False, True], preset     # one export for both sizes
    # the same model with a plain range: torch.export refuses it
    (root / "suites" / "dyn.yaml").write_text(WINDOWS.replace(
        "{H: {sizes: [16, 24], multiple_of: 8}, W: {sizes: [24, 16], multiple_of: 8}}", "{H: [16, 24], W: [24, 16]}"))
    with contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        refused = api.check(api.CheckRequest(backends=["executorch_cpu_fp32"], running=api.Running(in_process=True),
                                             selection=api.Selection(test_ids=["windows@*"])), settings=settings)
    assert {r.verdict for r in refused.results} == {Verdict.EXPORT_FAIL}


@pytest.mark.slow
def test_one_artifact_serves_every_size_on_onnxruntime_and_executorch(tmp_path):
    root = tmp_path / "p"
    _suite(root)
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0, batch=1)
    with contextlib.chdir(root):
        recorded = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        assert {r.verdict for r in recorded.results} == {Verdict.RECORDED}
        checked = api.check(api.CheckRequest(backends=["onnx_cpu_fp32", "executorch_cpu_fp32"],
                                             running=api.Running(in_process=True)), settings=settings)
    got = {(r.test_id, r.preset): r for r in checked.results}
    for preset in ("onnx_cpu_fp32", "executorch_cpu_fp32"):
        for group in (("lin@B=2", "lin@B=9"), ("addmm@B=3_S=2", "addmm@B=7_S=5")):
            assert {got[t, preset].verdict for t in group} == {Verdict.PASS}, preset
            # one export: the first size exported it, the other loaded it from the cache
            assert sorted(got[t, preset].cache_hit for t in group) == [False, True], (preset, group)
        assert got["branchy", preset].verdict is Verdict.PASS
    # a model that branches on the size: ExecuTorch's torch.export refuses the range of sizes;
    # torch.onnx.export bakes in the branch of the size it exported at, so the other size,
    # run on that artifact, takes the wrong branch
    assert {got[t, "executorch_cpu_fp32"].verdict for t in ("branchy@B=2", "branchy@B=9")} == {Verdict.EXPORT_FAIL}
    assert {got[t, "onnx_cpu_fp32"].verdict for t in ("branchy@B=2", "branchy@B=9")} == {Verdict.PASS,
                                                                                         Verdict.MISMATCH}
    # one cache entry per group and preset, beside those of the static tests (ExecuTorch made
    # none for branchy's sizes)
    made = [json.loads(e.read_text())["preset"] for e in (root / ".opdiff-cache").glob("*/*/entry.json")]
    assert (made.count("onnx_cpu_fp32"), made.count("executorch_cpu_fp32")) == (3 + 3, 3 + 2), made
    # a repro script exports static shapes: for a sized test it says so, and how to rerun it
    with contextlib.chdir(root), pytest.raises(OpdiffError) as err:
        reproduce("branchy@B=9", "onnx_cpu_fp32", root / "repro.py", in_process=True)
    assert "sized test (dynamic shapes)" in str(err.value) and "--test-ids 'branchy@*'" in str(err.value)


INT8_SUITE = """
dims: {B: 4, N: 16}
tests:
  - id: lin
    op: {type: module, path: torch.nn.Linear, args: [16, 8]}
    in: [{type: tensor, shape: [B, N], dtype: float32}]
    dynamic: {B: [2, 9]}
"""


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["executorch_cpu_int8", "onnx_cpu_int8", "onnx_cpu_int8dyn"])
def test_an_int8_preset_quantizes_once_and_judges_every_size_against_its_own_reference(tmp_path, preset):
    root = tmp_path / "p"
    _suite(root, INT8_SUITE)
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0, batch=1)
    with contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        checked = api.check(api.CheckRequest(backends=[preset], running=api.Running(in_process=True)),
                            settings=settings)
    got = {r.test_id: r for r in checked.results}
    sized = [got["lin@B=2"], got["lin@B=9"]]
    # one export, calibrated alike whichever size made it; each size judged against the
    # quantized model rerun on its own inputs (the example size's reference would not fit B=9)
    assert sorted(r.cache_hit for r in sized) == [False, True]
    assert sized[0].calibration == sized[1].calibration and len(sized[0].calibration) == 16
    for r in [*sized, got["lin"]]:
        assert r.metrics.lowering_steps is not None, (r.test_id, r.message)
        if x86_int8_saturates() and preset.startswith("onnx"):   # ORT's u8s8 kernels saturate without VNNI
            assert r.verdict is Verdict.PASS or r.message.startswith("lowering error"), (r.test_id, r.message)
        else:
            assert r.verdict is Verdict.PASS, (r.test_id, r.message)


def test_a_preset_that_exports_static_shapes_only_skips_the_sized_tests_with_its_reason(tmp_path):
    from helpers.check import make_site, plugin_installed

    root = tmp_path / "p"
    _suite(root, INT8_SUITE)
    site = make_site(tmp_path / "site", "[opdiff_snap.backends]\n"
                                        "staticonly = helpers.check.opdiff_perturb:StaticOnlyBackend\n")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0, batch=1)
    with contextlib.chdir(root), plugin_installed(site):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
        checked = api.check(api.CheckRequest(backends=["staticonly_cpu_fp32"], running=api.Running(in_process=True)),
                            settings=settings)
    got = {r.test_id: r for r in checked.results}
    for test_id in ("lin@B=2", "lin@B=9"):   # not applicable here, which is no failure of the backend
        assert got[test_id].verdict is Verdict.SKIPPED, got[test_id].message
        assert "does not export dynamic shapes" in got[test_id].message
    assert got["lin"].verdict is Verdict.PASS


def test_an_rnn_keeps_its_length_dynamic_on_onnx_whatever_the_process_exported_before(tmp_path):
    # torch.onnx swaps in a while-loop RNN kernel for a dynamic length; without care only
    # the first RNN a process exports gets it, and the later ones keep their length static
    from opdiff_snap.backends.base import DynamicDim
    from opdiff_snap.backends.registry import backend_for, get_preset

    class Flat(torch.nn.Module):    # the modules check exports take flat tensors
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, *x):
            return self.rnn(*x)[0]

    preset = get_preset("onnx_cpu_fp32")
    backend = backend_for(preset)
    torch.manual_seed(0)
    for i, (rnn, layers) in enumerate([(torch.nn.GRU, 1), (torch.nn.GRU, 2), (torch.nn.LSTM, 2), (torch.nn.GRU, 1)]):
        module = Flat(rnn(6, 8, num_layers=layers, batch_first=True)).eval()
        exported = backend.export_dynamic(module, (torch.randn(2, 3, 6),), ({1: DynamicDim("T", 2, 16, 3)},),
                                          preset, tmp_path / str(i))
        run = backend.load(exported, preset)
        longer = torch.randn(2, 9, 6)
        (out, *_), expected = run((longer,)), module(longer)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4, msg=f"export {i}: {module}")
