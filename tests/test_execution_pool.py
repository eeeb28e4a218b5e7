"""WorkerPool: isolation (CRASH with the signal, TIMEOUT), replacement, -j 2, in-process."""

import os

import pytest
import torch
from helpers.execution.cases import job, module_case, op_case, x

from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.execution.pool import WorkerPool, death_description


def relu_jobs(n, prefix="relu", preset="torch_cpu_fp32"):
    return [job(op_case("aten::relu", id=f"{prefix}{i}"), [x(4, seed=i)], preset=preset, key=f"{prefix}{i}")
            for i in range(n)]


def check_relu(outcome):
    i = int(outcome.key.removeprefix("relu").removeprefix("after"))
    assert outcome.status is None, outcome.error_message
    torch.testing.assert_close(restore_outputs(outcome.output_structure, outcome.outputs), x(4, seed=i).relu())


def test_death_description_names_the_signal():
    assert death_description(-11) == ("signal SIGSEGV", death_description(-11)[1])
    assert "SIGSEGV" in death_description(-11)[1]
    assert death_description(3)[0] == "exit code 3"


def test_in_process_mode_runs_here():
    with WorkerPool(jobs=2, in_process=True) as pool:
        outcomes = list(pool.run(relu_jobs(3)))
    assert [o.key for o in outcomes] == ["relu0", "relu1", "relu2"]
    assert {o.worker_pid for o in outcomes} == {os.getpid()}
    for o in outcomes:
        check_relu(o)


@pytest.mark.slow
def test_segfault_is_crash_and_the_replacement_keeps_serving():
    crash = job(module_case("file:crashy.py::Segfault", id="segv"), [x(3)], key="segv")
    jobs = relu_jobs(2) + [crash] + relu_jobs(3, prefix="after")
    with WorkerPool(jobs=1, timeout_s=60) as pool:
        outcomes = list(pool.run(jobs))
        assert pool.started_workers == 2   # one replacement, no more
    assert sorted(o.key for o in outcomes) == sorted(j.key for j in jobs)  # exactly one each
    by_key = {o.key: o for o in outcomes}
    seg = by_key.pop("segv")
    assert seg.status is Verdict.CRASH
    assert seg.error_class == "signal SIGSEGV" and "SIGSEGV" in seg.error_message
    # the worker's own last words (its stderr goes to a log, not into the run's output)
    assert "about to read address 0" in seg.error_message
    for o in by_key.values():
        check_relu(o)
    before = {by_key[f"relu{i}"].worker_pid for i in range(2)}
    after = {by_key[f"after{i}"].worker_pid for i in range(3)}
    assert len(before) == 1 and len(after) == 1 and before != after
    assert seg.worker_pid in before and os.getpid() not in before | after


@pytest.mark.slow
def test_hang_is_timeout_and_others_finish_on_two_workers():
    hang = job(module_case("file:crashy.py::Hang", id="hang"), [x(3)], key="hang")
    jobs = [hang] + relu_jobs(6)
    with WorkerPool(jobs=2, timeout_s=5) as pool:
        outcomes = list(pool.run(jobs))
        more = list(pool.run(relu_jobs(2, prefix="after")))  # the pool lives on between runs
    assert len(outcomes) == len(jobs)
    by_key = {o.key: o for o in outcomes}
    assert by_key["hang"].status is Verdict.TIMEOUT
    assert "no result after 5 s" in by_key["hang"].error_message
    served = {o.worker_pid for k, o in by_key.items() if k != "hang"}
    assert by_key["hang"].worker_pid not in served
    for o in [*(o for k, o in by_key.items() if k != "hang"), *more]:
        check_relu(o)


@pytest.mark.slow
def test_onnx_jobs_on_two_workers_in_completion_order():
    jobs = relu_jobs(4, preset="onnx_cpu_fp32")
    with WorkerPool(jobs=2, timeout_s=120) as pool:
        outcomes = list(pool.run(iter(jobs)))
    assert sorted(o.key for o in outcomes) == [j.key for j in jobs]
    assert len({o.worker_pid for o in outcomes}) == 2
    for o in outcomes:
        check_relu(o)
        assert o.export_ms > 0 and o.load_ms is not None


@pytest.mark.slow
def test_leaving_early_stops_every_worker():
    hang = job(module_case("file:crashy.py::Hang", id="hang"), [x(3)], key="hang")
    pool = WorkerPool(jobs=2, timeout_s=300)
    with pool:
        it = pool.run([*relu_jobs(1), hang])
        first = next(it)               # relu0 finishes; hang keeps its worker busy
        check_relu(first)
        procs = [w.proc for w in pool._workers]
        assert len(procs) == 2
    it.close()
    for p in procs:
        p.join(timeout=10)
        assert not p.is_alive()
    assert pool._workers == []


def test_a_failure_quotes_what_the_backend_printed_during_that_job():
    loud = job(module_case("file:crashy.py::LoudFailure", id="loud"), [x(3)], key="loud")
    with WorkerPool(jobs=1, timeout_s=60) as pool:
        outcomes = {o.key: o for o in pool.run(relu_jobs(1) + [loud] + relu_jobs(1, prefix="after"))}
    assert outcomes["loud"].status is not None
    assert "error: 0x14" in outcomes["loud"].error_message
    assert "Missing operator: aten::made_up.out" in outcomes["loud"].error_message
    check_relu(outcomes["after0"])   # the worker survives and later jobs quote nothing stale
    assert "backend output" not in (outcomes["after0"].error_message or "")


def test_warm_up_runs_each_presets_backend_and_leaves_the_random_stream_alone():
    from opdiff_snap.backends.registry import get_preset
    from opdiff_snap.execution.warmup import WarmUp, warm_up

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    spent = warm_up([WarmUp(get_preset("torch_cpu_fp32"))])
    assert list(spent) == ["torch_cpu_fp32"] and spent["torch_cpu_fp32"] >= 0
    torch.testing.assert_close(torch.rand(3), expected)


def test_prestart_starts_the_workers_the_jobs_need():
    """A check starts one worker while it plans and the rest once it knows its jobs: one job
    on a pool of two gets one worker (each is an interpreter importing torch)."""
    with WorkerPool(jobs=2, timeout_s=120) as pool:
        pool.prestart((), jobs=1)
        assert pool.started_workers == 1
        pool.prestart((), jobs=1)       # the plan: one job
        [outcome] = list(pool.run(relu_jobs(1)))
        assert pool.started_workers == 1
        pool.prestart((), jobs=5)       # more jobs than the pool has room for
        assert pool.started_workers == 2
    check_relu(outcome)


def test_a_stopped_worker_runs_its_exit_handlers(tmp_path):
    """A worker leaves without the interpreter's teardown, but the exit handlers a job's
    libraries registered still run when the pool closes (multiprocessing's release the
    named semaphores such libraries make)."""
    marker = tmp_path / "atexit"
    with WorkerPool(jobs=1, timeout_s=120) as pool:
        [outcome] = list(pool.run([job(module_case("file:crashy.py::AtExit", str(marker), id="atexit"), [x(3)],
                                       key="atexit")]))
        assert outcome.status is None, outcome.error_message
        assert not marker.exists()        # the worker is still there
    assert marker.read_text() == "ran"


@pytest.mark.slow
def test_warm_workers_serve_the_same_results():
    from opdiff_snap.backends.registry import get_preset
    from opdiff_snap.execution.warmup import WarmUp

    with WorkerPool(jobs=1, timeout_s=120) as pool:
        pool.prestart([WarmUp(get_preset("onnx_cpu_fp32"))])
        outcomes = list(pool.run(relu_jobs(2, preset="onnx_cpu_fp32")))
    assert pool.started_workers == 1
    for o in outcomes:
        check_relu(o)


def test_a_preset_whose_artifacts_are_cached_warms_up_its_runtime_only(tmp_path):
    """The worker imports ONNX Runtime before its first job (so load_ms times the load), and
    not the exporter, which a check that only loads never uses."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from opdiff_snap.backends.registry import get_preset\n"
            "from opdiff_snap.execution.warmup import WarmUp, warm_up\n"
            "warm_up([WarmUp(get_preset('onnx_cpu_fp32'), export=False)])\n"
            "print('onnxruntime' in sys.modules, 'onnxscript' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


def test_warm_ups_export_only_for_presets_without_cached_artifacts(tmp_path):
    from opdiff_snap.backends.registry import get_preset
    from opdiff_snap.execution.warmup import warm_ups

    entry = tmp_path / "ab" / "abcd"
    entry.mkdir(parents=True)
    (entry / "entry.json").write_text('{"export_ms": 1.0, "preset": "onnx_cpu_fp32"}')
    presets = [get_preset("onnx_cpu_fp32"), get_preset("onnx_cpu_fp16")]
    assert [w.export for w in warm_ups(presets, tmp_path)] == [False, True]
    assert [w.export for w in warm_ups(presets, None)] == [True, True]
