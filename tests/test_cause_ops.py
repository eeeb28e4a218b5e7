"""localize down to the ATen node, through isolated workers and registered test backends:
a wrong kernel called from `forward` is named by op and source line, a pair of ops that
only goes wrong fused is named as a range, a node that segfaults is a CRASH at that node,
and the node repro reproduces each standalone (exit 1) and passes on a clean backend."""

from __future__ import annotations

import contextlib
import inspect
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers.cause import SUITE, load_case, run_isolated, start_isolated
from helpers.cause.kernels import ENTRY_POINTS
from helpers.check import make_site, opdiff, plugin_installed

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.cause.calls import ScopeGraphTask
from opdiff_snap.cause.localize import localize
from opdiff_snap.cause.localize_report import format_report
from opdiff_snap.cause.repro import write_node_repro
from opdiff_snap.compare.tolerance import tolerance_for
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.pool import WorkerPool

MODELS = SUITE.parent / "models.py"


def line_of(marker: str) -> int:
    """The line of helpers/cause/models.py that carries `marker`."""
    lines = MODELS.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = make_site(tmp_path_factory.mktemp("site"), ENTRY_POINTS, "opdiff-cause-test")
    with plugin_installed(site):
        yield site


@pytest.fixture(scope="module")
def pool(site):
    """Isolated workers, started once the test backends are registered, shared by the tests."""
    from opdiff_snap.cause.calls import CallTreeTask

    with WorkerPool(jobs=2, timeout_s=120) as pool:
        warm = [CallTreeTask(*load_case("tanh_mlp"), key=str(i)) for i in range(2)]
        assert all(tree.error is None for tree in pool.run(warm))   # both workers up before the first test
        yield pool


def _localize(test_id: str, preset: str, pool: WorkerPool, **kw):
    case, invocation = load_case(test_id)
    return localize(case, invocation, get_preset(preset), pool=pool, **kw)


WRONG = [  # test, scope localize should descend into, the wrong op, the marker on its source line
    ("tanh_mlp", "", "aten::tanh.default", "# <- tanh"),
    ("exp_head", "", "aten::exp.default", "# <- exp"),
    ("outer", "block", "aten::sigmoid.default", "# <- sigmoid"),
]


@pytest.mark.parametrize("test_id, scope, op, marker", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_kernel_called_in_forward_is_named_with_its_source_line(pool, test_id, scope, op, marker):
    report = _localize(test_id, "wrongkernel_cpu_fp32", pool)
    text = format_report(report)
    assert report.first_divergent is None, text           # no leaf submodule diverges alone...
    assert all(r.status is Verdict.PASS for r in report.rows)
    ops = report.ops
    assert ops is not None and ops.scope == scope, text   # ...so it descends into the smallest divergent scope
    f = ops.finding
    assert f is not None and not f.is_range and f.status is Verdict.MISMATCH, text
    assert f.nodes[0].target == op
    assert f.nodes[0].source_path == f"{MODELS}:{line_of(marker)}"
    assert marker in f.nodes[0].source
    assert f.metrics["max_rel"] == pytest.approx(2.0 ** -7, rel=0.05)
    # every node before it was run alone and reproduced the baseline, but those computed from
    # weights only (the transposed Linear weights), which are not run
    ran = {r.node.index: r.status for r in ops.rows}
    assert [ran[i] for i in range(f.start + 1)] == [
        Verdict.SKIPPED if n.constant else Verdict.PASS for n in [r.node for r in ops.rows][:f.start]] + [Verdict.MISMATCH]
    assert {r.node.target for r in ops.rows if r.status is Verdict.SKIPPED} == {"aten::permute.default"}
    assert f.inputs_drift is not None and f.inputs_drift["max_abs"] < 1e-6   # its inputs came in clean
    assert "within tolerance" in f.inputs_note
    expected_cmd = f"opdiff repro {test_id} -b wrongkernel_cpu_fp32{f' --scope {scope}' if scope else ''} --node {f.start}"
    assert report.repro_command() == expected_cmd
    assert f"MISMATCH at node {f.start}: {op}(f32[4, " in text
    assert expected_cmd in text


def test_a_module_without_submodules_is_descended_into_by_default(pool):
    report = _localize("functional", "wrongkernel_cpu_fp32", pool)
    text = format_report(report)
    assert [r.label for r in report.rows] == ["<root>"] and report.first_divergent.name == ""
    assert report.ops is not None and report.ops.scope == "", text   # no --ops needed
    f = report.ops.finding
    assert f is not None and f.nodes[0].target == "aten::tanh.default", text
    assert f.nodes[0].source_path == f"{MODELS}:{line_of('# <- functional tanh')}"


def test_the_lowest_divergent_scope_is_chosen(pool):
    report = _localize("outer", "wrongkernel_cpu_fp32", pool)
    status = {r.label: r.status for r in report.rows + report.enclosing}
    assert status == {"pre": Verdict.PASS, "block.inp": Verdict.PASS, "block.out": Verdict.PASS,
                      "post": Verdict.PASS, "<root>": Verdict.MISMATCH, "block": Verdict.MISMATCH}
    assert report.ops.scope == "block" and report.ops.scope_class == "SiluGate"


def test_ops_descends_into_a_divergent_leaf_when_asked(pool):
    plain = _localize("net", "wrongkernel_cpu_fp32", pool)
    assert plain.first_divergent.name == "act" and plain.ops is None   # the submodule answer, as before
    deep = _localize("net", "wrongkernel_cpu_fp32", pool, ops=True)
    assert deep.ops.scope == "act" and deep.ops.node_count == 1
    f = deep.ops.finding
    assert f.nodes[0].target == "aten::tanh.default" and f.status is Verdict.MISMATCH
    # nn.Tanh's own forward (wherever torch keeps it): no user frame below it
    assert f.nodes[0].source_path.startswith(f"{inspect.getsourcefile(torch.nn.Tanh)}:"), f.nodes[0].source_path
    assert "scope's own inputs" in f.inputs_note


def test_ops_that_only_fail_together_are_named_as_the_shortest_range(pool):
    report = _localize("affine", "fusekernel_cpu_fp32", pool)
    ops = report.ops
    text = format_report(report)
    assert report.first_divergent is None and ops.scope == "", text
    assert len(ops.rows) == ops.node_count   # every node ran alone (or is a weight transpose) and passed
    assert [r.status for r in ops.rows] == [Verdict.SKIPPED if r.node.constant else Verdict.PASS for r in ops.rows]
    assert ops.whole_graph is Verdict.MISMATCH
    f = ops.finding
    assert f.is_range and f.status is Verdict.MISMATCH, text
    assert [n.target for n in f.nodes] == ["aten::mul.Tensor", "aten::add.Tensor"]
    assert f.sources() == [f"models.py:{line_of('# <- mul feeding add')} in forward: "
                           "h = h * self.gamma + self.beta  # <- mul feeding add"]
    assert report.repro_command().endswith(f"--node {f.start}-{f.stop}")
    assert f"nodes {f.start}-{f.stop} diverge together" in text


def test_a_clean_backend_finds_nothing_at_any_level(pool):
    report = _localize("affine", "torch_cpu_fp32", pool)
    assert not report.found and report.ops is None
    assert [r.status for r in report.rows + report.enclosing] == [Verdict.PASS] * 2
    assert "reproduce the baseline" in report.summary()


@pytest.mark.slow
def test_a_segfaulting_node_is_a_crash_at_that_node(pool):
    report = _localize("exp_head", "crashkernel_cpu_fp32", pool)
    text = format_report(report)
    root = next(r for r in report.enclosing if r.name == "")
    assert root.status is Verdict.CRASH   # the whole module takes its worker down...
    f = report.ops.finding
    assert f is not None and f.status is Verdict.CRASH, text   # ...and so does exp alone, and nothing before it
    assert f.nodes[0].target == "aten::exp.default"
    assert "SIGSEGV" in f.message
    assert all(r.status in (Verdict.PASS, Verdict.SKIPPED) for r in report.ops.rows if r.node.index < f.start)
    assert f"CRASH at node {f.start}" in text and report.divergence == "failed"


@pytest.mark.slow
def test_node_repros_reproduce_standalone_and_pass_on_a_clean_backend(pool, tmp_path):
    found = [("tanh_mlp", "", "wrongkernel_cpu_fp32", ["aten::tanh.default"]),
             ("exp_head", "", "wrongkernel_cpu_fp32", ["aten::exp.default"]),
             ("outer", "block", "wrongkernel_cpu_fp32", ["aten::sigmoid.default"]),
             ("affine", "", "fusekernel_cpu_fp32", ["aten::mul.Tensor", "aten::add.Tensor"])]
    jobs = []
    for test_id, scope, wrong, ops in found:
        case, invocation = load_case(test_id)
        graph = next(iter(pool.run([ScopeGraphTask(case, invocation, scope)])))
        targets = [n.target for n in graph.nodes]
        start = next(i for i in range(len(targets)) if targets[i:i + len(ops)] == ops)
        stop = start + len(ops) - 1
        # a clean backend passes the same repro: once is enough (the fused pair, the only module-shaped one)
        for preset, code in ((wrong, 1),) + ((("torch_cpu_fp32", 0),) if test_id == "affine" else ()):
            p = get_preset(preset)
            script = write_node_repro(case, graph, start, stop, p, tmp_path / f"{test_id}_{preset}.py",
                                      tolerance_for(case.tolerance, p))
            assert "opdiff_snap" not in script.read_text()
            jobs.append((script, code, start_isolated(script, cwd=tmp_path)))
    for script, code, proc in jobs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == code, f"{script.name}:\n{out}"
        assert out.strip().splitlines()[-2] == ("MISMATCH" if code else "PASS"), out


@pytest.fixture(scope="module")
def project(site, tmp_path_factory):
    """helpers.cause's suite recorded on torch_cpu_fp32 (its functional-op models only)."""
    from opdiff_snap import api
    from opdiff_snap.core.config import Settings

    root = tmp_path_factory.mktemp("project")
    (root / "suites").mkdir()
    for name in ("suite.yaml", "models.py"):
        shutil.copy(SUITE.parent / name, root / "suites" / name)
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(selection=api.Selection(test_ids=["tanh_mlp"]),
                                              running=api.Running(in_process=True)),
                                              settings=Settings(suites=Path("suites"), repeats=1, warmup=0, jobs=1))
    assert {r.verdict for r in report.results} == {Verdict.RECORDED}
    return root


@pytest.mark.slow
def test_cli_localize_offers_the_node_repro_which_reproduces(project, site):
    r = opdiff(project, site, "localize", "tanh_mlp", "-b", "wrongkernel_cpu_fp32", "-j", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    line = line_of("# <- tanh")
    assert "MISMATCH at node 2: aten::tanh.default(f32[4, 16]) -> f32[4, 16]" in r.stdout
    assert f"models.py:{line} in forward" in r.stdout
    offered = re.search(r"Reproduce it alone: (opdiff repro .*) -o repro_node\.py", r.stdout)
    assert offered and offered[1] == "opdiff repro tanh_mlp -b wrongkernel_cpu_fp32 --node 2", r.stdout
    r = opdiff(project, site, *offered[1].split()[1:], "-o", "bug/node.py")
    assert r.returncode == 0, r.stderr
    run = run_isolated(project / "bug" / "node.py", cwd=project)
    assert run.returncode == 1 and "MISMATCH" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
def test_a_node_out_of_range_is_one_clear_error(project, site):
    r = opdiff(project, site, "repro", "tanh_mlp", "-b", "wrongkernel_cpu_fp32", "--node", "9", "-o", "x.py")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--node '9': scope '<root>' of test 'tanh_mlp' has 5 ATen nodes, numbered 0-4" in r.stderr
    assert "Traceback" not in r.stderr and not (project / "x.py").exists()


@pytest.mark.parametrize("kw, says", [
    ({"node": "two"}, "--node 'two': give a node number, or a range like 5-7"),
    ({"node": "3-1"}, "--node '3-1': a range goes from the lower number to the higher, like 1-3"),
    ({"node": "0", "scope": "nosuch"}, "--scope 'nosuch': the module has no submodule 'nosuch'; its submodules: fc1, fc2"),
    ({"node": "0", "scope": "fc1#1"}, "--scope 'fc1#1': submodule 'fc1' is called fewer than 2 times"),
    ({"scope": "fc1"}, "--scope 'fc1' names a submodule whose ATen nodes to reproduce; give --node too"),
])
def test_bad_node_arguments_are_clear_errors(project, site, kw, says):
    from opdiff_snap import api
    from opdiff_snap.core.errors import OpdiffError

    with contextlib.chdir(project), pytest.raises(OpdiffError) as err:
        api.repro("tanh_mlp", "wrongkernel_cpu_fp32", project / "x.py", in_process=True, **kw)
    assert says in str(err.value)
    assert not (project / "x.py").exists()
