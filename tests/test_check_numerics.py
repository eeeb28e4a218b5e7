"""Verdicts that hold across machines: a wrong kernel is caught on every test it reaches
and nothing else is flagged; a correct backend summing in another order, or the
baseline on another thread count, passes everywhere.

Real runs through the API: goldens recorded on torch_cpu_fp32 (with their float64
references), checked on the test families of helpers/numerics/backends.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers.check import make_site, plugin_installed
from helpers.numerics import ENTRY_POINTS
from helpers.numerics.backends import SCALED, SWAPPED
from torch.utils._python_dispatch import TorchDispatchMode

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.prepare import flat_module
from opdiff_snap.goldens import GoldenStore
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.model import Tolerance

HERE = Path(__file__).resolve().parent / "helpers" / "numerics"
REACHED = {"exp", "tanh", "sigmoid", "maximum", "minimum", "nn_tanh", "nn_sigmoid", "tanh_mlp",
           "exp_head", "manual_tanh", "gate", "floor_at", "tanh_pair"}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("site"), ENTRY_POINTS, "opdiff-numerics-test")
    with plugin_installed(site):
        yield site


def _project(root: Path, suite: str) -> Path:
    (root / "suites").mkdir(parents=True)
    for name in (suite, "mods.py"):
        shutil.copy(HERE / name, root / "suites" / name)
    return root


def _settings(**kw) -> Settings:
    return Settings(suites=Path("suites"), repeats=1, warmup=0, **{"jobs": 1, **kw})


def _check(root: Path, backends, in_process=True, **kw):
    settings = _settings(**kw.pop("settings", {}))
    with contextlib.chdir(root):
        report = api.check(api.CheckRequest(backends, running=api.Running(in_process=in_process), **kw),
                           settings=settings)
    return {(r.test_id, r.preset): r for r in report.results}


@pytest.fixture(scope="module")
def kernels(site, tmp_path_factory):
    root = _project(tmp_path_factory.mktemp("kernels"), "suite.yaml")
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=_settings())
    assert {r.verdict for r in report.results} == {Verdict.RECORDED}
    return root


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func)
        return func(*args, **(kwargs or {}))


def test_the_suite_reaches_the_wrong_kernels_exactly_where_it_says(kernels):
    """Which tests execute a broken op, found by running each one as the backend would."""
    store = GoldenStore(kernels / "goldens")
    reached = set()
    with contextlib.chdir(kernels):
        cases = load_suites([Path("suites/suite.yaml")])
        assert len(cases) >= 30 and sum(c.test_type == "pair" for c in cases) == 2
        for case in cases:
            prepared = flat_module(case, store.read(case.id, 0).invocation)
            with torch.no_grad(), _Ops() as ops:
                prepared.module(*prepared.fresh_inputs())
            if ops.seen & (SCALED | set(SWAPPED)):
                reached.add(case.id)
    assert reached == REACHED


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_wrong_kernel_is_caught_on_every_test_it_reaches_and_nowhere_else(kernels, precision):
    preset = f"wrongkernel_cpu_{precision}"
    res = _check(kernels, [preset, f"torch_cpu_{precision}"])
    for (test_id, name), r in res.items():
        if name == preset and test_id in REACHED:
            assert r.verdict is Verdict.MISMATCH, (test_id, r.verdict, r.message)
    if precision == "fp32":
        # the one-ulp move of every output is rounding, never a finding
        wrong = {t: r.verdict for (t, name), r in res.items() if name == preset and t not in REACHED}
        assert set(wrong.values()) == {Verdict.PASS}, wrong
    else:
        # plain fp16 torch passes the reached tests: the fp16 MISMATCHes are the bugs
        clean = {t: r.verdict for (t, name), r in res.items() if name == "torch_cpu_fp16" and t in REACHED}
        assert set(clean.values()) == {Verdict.PASS}, clean
    pair = res["tanh_pair", preset]
    assert pair.message.startswith("side a (module) and side b (functional) drift from their golden")
    assert pair.metrics.b_vs_a.verdict == "PASS"     # both sides broke identically


@pytest.fixture(scope="module")
def sums(site, tmp_path_factory):
    """sums.yaml recorded by one isolated worker using every core."""
    root = _project(tmp_path_factory.mktemp("sums"), "sums.yaml")
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(), settings=_settings(jobs=1, threads=os.cpu_count() or 1))
    assert {r.verdict for r in report.results} == {Verdict.RECORDED}
    return root


def test_another_summation_order_passes_and_would_not_without_the_reference(sums):
    res = _check(sums, ["splitsum_cpu_fp32"])
    assert {r.verdict for r in res.values()} == {Verdict.PASS}, \
        {k: (r.verdict, r.message) for k, r in res.items() if r.verdict is not Verdict.PASS}
    assert sum(r.metrics.within_rounding for r in res.values()) > 0
    plain = _check(sums, ["splitsum_cpu_fp32"], tolerance=Tolerance(baseline_factor=0.0))
    assert Verdict.MISMATCH in {r.verdict for r in plain.values()}   # the old policy's false alarms


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to vary the thread count")
def test_another_thread_count_passes(sums):
    res = _check(sums, ["torch_cpu_fp32"], in_process=False)     # one thread per job, the default
    assert {r.verdict for r in res.values()} == {Verdict.PASS}
    metas = [json.loads(p.read_text().splitlines()[0]) for p in (sums / "store" / "runs").glob("*.jsonl")]
    record = next(m for m in metas if m["command"] == "record")
    check = max((m for m in metas if m["command"] == "check"), key=lambda m: m["started"])
    assert record["env"]["threads"]["intra_op"] == os.cpu_count()
    assert check["env"]["threads"]["intra_op"] == 1 and check["settings"]["threads"] == 1
