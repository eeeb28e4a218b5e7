"""flat_module / restore_outputs: tensors in, flat tensors out, structure kept."""

import pytest
import torch
from helpers.execution.cases import const, module_case, op_case, states_for, x

from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.execution.prepare import flat_module
from opdiff_snap.suite.model import Call, Invocation


def run_flat(case, args, kwargs=None, states=None):
    inv = Invocation(args=list(args), kwargs=dict(kwargs or {}),
                     states=states if states is not None else states_for(case))
    p = flat_module(case, inv)
    flat = list(p.module(*p.fresh_inputs()))
    return p, restore_outputs(p.out_structure, flat)


def test_scalar_arg_and_kwarg_are_baked_in():
    a, b = x(2, 3, seed=1), x(2, 3, seed=2)
    p, out = run_flat(op_case("aten::add.Tensor"), [a, b], {"alpha": 2})
    assert len(p.inputs) == 2                        # alpha is not an input
    assert p.out_structure == {"tensor": 0}
    torch.testing.assert_close(out, a + 2 * b)
    # the baked constant is really used: other inputs, same alpha
    torch.testing.assert_close(p.module(b, a)[0], b + 2 * a)


def test_the_module_handed_on_was_never_called():
    """The structure probe calls a copy: a module that keeps state from its first call (a
    cache built in float32) is handed to a backend as built, so cast to float16 it runs in
    float16 (it would fail on its float32 cache otherwise)."""
    from opdiff_snap.backends.family_common import cast_module

    case = module_case("file:crashy.py::CachesOnFirstCall", 4)
    inv = Invocation(args=[x(3, 4, seed=1)], kwargs={}, states=states_for(case))
    p = flat_module(case, inv)
    assert p.out_structure == {"tensor": 0}
    half = cast_module(p.module, torch.float16)
    out = half(*[t.half() for t in p.fresh_inputs()])[0]
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), p.module(*p.fresh_inputs())[0], atol=0.05, rtol=0.01)


def test_list_of_tensors_becomes_separate_inputs():
    a, b = x(2, 3, seed=1), x(2, 4, seed=2)
    p, out = run_flat(op_case("aten::cat"), [[a, b], 1])
    assert [t.shape for t in p.inputs] == [(2, 3), (2, 4)]
    torch.testing.assert_close(out, torch.cat([a, b], 1))


def test_optional_none_argument():
    a = x(4, seed=3)
    p, out = run_flat(op_case("aten::clamp"), [a, None, 0.25])
    assert len(p.inputs) == 1
    torch.testing.assert_close(out, a.clamp(max=0.25))


def test_kwargs_and_int_list():
    a = x(3, 4, seed=4)
    p, out = run_flat(op_case("aten::sum.dim_IntList"), [a, [1]], {"keepdim": True})
    assert out.shape == (3, 1)
    torch.testing.assert_close(out, a.sum(1, keepdim=True))


@pytest.mark.parametrize("target,args", [("aten::topk", [2]), ("aten::max.dim", [1])])
def test_multiple_outputs(target, args):
    a = x(3, 5, seed=5)
    p, out = run_flat(op_case(target), [a, *args])
    assert p.out_structure == {"tuple": [{"tensor": 0}, {"tensor": 1}]}
    assert p.out_dtypes == [torch.float32, torch.int64]
    expected = tuple(torch.ops.aten.topk(a, 2) if target == "aten::topk" else torch.ops.aten.max.dim(a, 1))
    assert isinstance(out, tuple) and len(out) == 2
    torch.testing.assert_close(out[0], expected[0])
    assert torch.equal(out[1], expected[1])


def test_module_uses_stored_state_not_a_fresh_init():
    case = module_case("file:crashy.py::Scaled", 4)
    states = states_for(case, seed=0)
    a = x(4, seed=6)
    torch.manual_seed(12345)  # a different init would give different weights
    p, out = run_flat(case, [a], states=states)
    s = states["a"]
    torch.testing.assert_close(out, a * s["weight"] + s["offset"])
    fresh = dict(p.module.side_a.state_dict())
    assert torch.equal(fresh["weight"], s["weight"]) and torch.equal(fresh["offset"], s["offset"])


def test_dotted_module_path_with_ctor_args():
    case = module_case("torch.nn.Linear", 4, 3)
    states = states_for(case)
    a = x(2, 4, seed=7)
    _, out = run_flat(case, [a], states=states)
    torch.testing.assert_close(out, a @ states["a"]["weight"].T + states["a"]["bias"])


def test_state_mismatch_is_a_clear_error():
    case = module_case("torch.nn.Linear", 4, 3)
    states = {"a": {"weight": torch.zeros(3, 4)}}  # bias missing
    with pytest.raises(OpdiffError, match="stored weights do not fit.*bias"):
        flat_module(case, Invocation(args=[x(2, 4)], kwargs={}, states=states))
    with pytest.raises(OpdiffError, match="no module state"):
        flat_module(case, Invocation(args=[x(2, 4)], kwargs={}, states={}))


def test_pair_runs_both_sides_on_the_same_inputs():
    side_b = Call("module", "torch.nn.Hardtanh", args=(const(0.0), const(1.0)))
    case = module_case("torch.nn.ReLU", id="pair", pair=side_b)
    a = x(10, seed=8)
    p, out = run_flat(case, [a])
    assert len(p.inputs) == 1
    assert p.out_structure == {"dict": [["a", {"tensor": 0}], ["b", {"tensor": 1}]]}
    torch.testing.assert_close(out["a"], a.relu())
    torch.testing.assert_close(out["b"], a.clamp(0, 1))


def test_cast_input0_to_complex_abs():
    z = torch.complex(x(3, 4, seed=9), x(3, 4, seed=10))
    real = torch.view_as_real(z).clone()           # as materialize stores it
    p, out = run_flat(op_case("aten::abs", cast_input0_to_complex=True), [real])
    assert p.inputs[0].shape == (3, 4, 2) and not p.inputs[0].is_complex()
    assert p.out_structure == {"tensor": 0}
    torch.testing.assert_close(out, z.abs())


def test_complex_inputs_and_outputs_travel_as_real_pairs():
    z = torch.complex(x(5, seed=11), x(5, seed=12))
    w = torch.complex(x(5, seed=13), x(5, seed=14))  # a plain complex input (no cast flag)
    p, out = run_flat(op_case("aten::mul.Tensor", cast_input0_to_complex=True),
                      [torch.view_as_real(z).clone(), w])
    assert [t.shape for t in p.inputs] == [(5, 2), (5, 2)]
    assert not any(t.is_complex() for t in p.inputs)
    assert p.out_structure == {"complex": 0}
    flat = p.module(*p.inputs)
    assert not flat[0].is_complex() and flat[0].shape == (5, 2)
    assert out.is_complex()
    torch.testing.assert_close(out, z * w)


def test_python_scalar_output_round_trips():
    a = torch.tensor(2.5)
    p, out = run_flat(op_case("aten::_local_scalar_dense"), [a])
    assert p.out_structure == {"scalar": 0, "type": "float"}
    assert isinstance(out, float) and out == 2.5


def test_in_place_op_does_not_change_stored_inputs():
    a = x(3, seed=15)
    before = a.clone()
    p, _ = run_flat(op_case("aten::add_.Tensor"), [a, torch.ones(3)])
    assert torch.equal(a, before) and torch.equal(p.inputs[0], before)
    torch.testing.assert_close(p.module(*p.fresh_inputs())[0], before + 1)


def test_outputs_that_do_not_fit_the_structure_are_refused_not_coerced():
    """A backend returning a float where the eager op gave an int, or two elements for a
    scalar, must not be rounded into a pass (the runner turns this into STRUCTURE_MISMATCH)."""
    import pytest as _pytest
    import torch as _torch

    from opdiff_snap.execution.outputs import restore_outputs

    structure = {"tuple": [{"scalar": 0, "type": "int"}, {"complex": 1}]}
    ok = restore_outputs(structure, [_torch.tensor(3), _torch.zeros(2, 2)])
    assert ok[0] == 3 and ok[1].is_complex()
    with _pytest.raises(ValueError, match="Python int"):
        restore_outputs(structure, [_torch.tensor(3.9), _torch.zeros(2, 2)])
    with _pytest.raises(ValueError, match="Python int"):
        restore_outputs(structure, [_torch.tensor([3, 4]), _torch.zeros(2, 2)])
    with _pytest.raises(ValueError, match="complex"):
        restore_outputs(structure, [_torch.tensor(3), _torch.zeros(2, 3)])
