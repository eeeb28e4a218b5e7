"""The Dispatcher (work queued early, each result taken by its own waiter) and UserCallJob
(a callable built in this process, run in an isolated worker), with real worker processes."""

from __future__ import annotations

import importlib.util
import secrets
import sys
import textwrap

import pytest
import torch
from helpers.execution.cases import job, op_case, x

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.execution.dispatch import Dispatcher, Ready
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.execution.pool import WorkerPool
from opdiff_snap.execution.pools import run_one
from opdiff_snap.execution.user_call import NotShippable, UserCallJob, ship
from opdiff_snap.suite.model import Call, Invocation, TestCase


@pytest.mark.slow
def test_dispatcher_gives_each_waiter_its_own_result():
    add = op_case("aten::add.Tensor")
    inputs = {f"k{i}": (x(3, seed=i), x(3, seed=10 + i)) for i in range(4)}

    def boom():
        raise ValueError("this item's golden is unreadable")

    dispatcher = Dispatcher(WorkerPool(jobs=2, timeout_s=120))
    try:
        for key, (a, b) in inputs.items():
            dispatcher.submit(key, lambda a=a, b=b, key=key: job(add, [a, b], key=key))
        dispatcher.submit("ready", lambda: Ready("known without running"))
        dispatcher.submit("broken", boom)
        with pytest.raises(ValueError, match="already queued"):
            dispatcher.submit("k0", lambda: Ready(None))
        # asked in another order than queued and than finished: each gets its own
        for key in ("k3", "broken", "ready", "k1", "k0", "k2"):
            if key == "broken":
                with pytest.raises(ValueError, match="golden is unreadable"):
                    dispatcher.wait(key)
                continue
            value = dispatcher.wait(key)
            if key == "ready":
                assert value == "known without running"
                continue
            a, b = inputs[key]
            assert value.key == key and value.status is None
            torch.testing.assert_close(restore_outputs(value.output_structure, value.outputs), a + b)
            assert not dispatcher.queued(key)
        # work queued after the pool went idle starts a new run on the same workers
        started = dispatcher.pool.started_workers
        dispatcher.submit("late", lambda: job(add, [x(2), x(2)], key="late"))
        assert dispatcher.wait("late").status is None
        assert dispatcher.pool.started_workers == started
        with pytest.raises(KeyError):
            dispatcher.wait("never queued")
        # run(): tasks now, as a pool runs them, while work queued before them keeps its results
        dispatcher.submit("earlier", lambda: job(add, [x(2), x(2)], key="earlier"))
        tasks = [job(add, [x(2, seed=i), x(2)], key=f"now{i}") for i in range(3)]
        assert [out.key for out in dispatcher.run(tasks)] == ["now0", "now1", "now2"]
        assert dispatcher.python is None
        assert dispatcher.wait("earlier").status is None
    finally:
        dispatcher.close()


def _module_from_file(tmp_path, source: str):
    """A module imported from a file under a name no fresh process can import."""
    name = f"opdiff_test_blocks_{secrets.token_hex(4)}"
    path = tmp_path / "blocks.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


BLOCKS = """
    import torch

    class Affine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((3,), 2.0))

        def forward(self, x):
            return x * self.w + 1

    def square(x):
        return x * x
"""


@pytest.mark.slow
def test_user_callable_reaches_the_worker_by_value_and_runs_on_the_stored_weights(tmp_path):
    blocks = _module_from_file(tmp_path, BLOCKS)
    module = blocks.Affine()
    shipped = ship(module)
    assert shipped.modules[blocks.__name__] == str(tmp_path / "blocks.py")
    stored = {"w": torch.tensor([1.0, -1.0, 0.5])}        # the golden's weights win over the object's
    inp = x(2, 3)
    case = TestCase(id="t::affine", suite=tmp_path / "test_x.py", call=Call("module", "blocks.Affine"),
                    inputs=(), kwargs={}, spec_hash="h-affine")
    out = run_one(UserCallJob("a", shipped, case, Invocation([inp], {}, {"a": stored}), get_preset("torch_cpu_fp32"),
                              repeats=1, warmup=0, reference=True), timeout_s=120)
    assert out.status is None, out.error_message
    torch.testing.assert_close(restore_outputs(out.output_structure, out.outputs), inp * stored["w"] + 1)
    assert out.reference is not None and out.reference[0].dtype == torch.float64

    fn_case = TestCase(id="t::square", suite=tmp_path / "test_x.py", call=Call("op", "blocks.square"),
                       inputs=(), kwargs={}, spec_hash="h-square")
    out = run_one(UserCallJob("s", ship(blocks.square), fn_case, Invocation([inp], {}, {}),
                              get_preset("torch_cpu_fp32"), repeats=1, warmup=0), timeout_s=120)
    assert out.status is None, out.error_message
    torch.testing.assert_close(restore_outputs(out.output_structure, out.outputs), inp * inp)


def test_what_cannot_travel_says_why():
    class Local(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(NotShippable, match=r"<locals>.Local is defined inside a function"):
        ship(Local())
    holder = torch.nn.Identity()
    holder.fn = lambda t: t
    with pytest.raises(NotShippable, match="defined inside a function|cannot be pickled"):
        ship(holder)
