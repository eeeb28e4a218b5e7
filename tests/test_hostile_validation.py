"""Validation gaps in what a user writes: a glob whose brackets do not pair, a seed
beyond the history's 64-bit column, a `dynamic` dim no input uses, and more dynamic
sizes than a test may have. Each is refused naming the file, the test or the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from opdiff_snap.expectations.file import ExpectationsError, load

PRESETS = ["onnx_cpu_fp32", "torch_cpu_fp32"]


def _refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "expectations.yaml"
    path.write_text(text)
    with pytest.raises(ExpectationsError) as caught:
        load(path, PRESETS)
    return str(caught.value)


@pytest.mark.parametrize("glob", ["erf]inv[", "erf[inv", "erf]inv", "a[b]c]d["])
def test_a_test_glob_whose_brackets_do_not_pair_is_refused(tmp_path, glob):
    message = _refusal(tmp_path, f'onnx_cpu_fp32:\n  - {{test: "{glob}", verdict: EXPORT_FAIL}}\n')
    assert "expectations.yaml" in message and glob in message and "not a valid glob" in message, message


def test_a_preset_glob_whose_brackets_do_not_pair_is_refused(tmp_path):
    message = _refusal(tmp_path, '"onnx]cpu[*":\n  - {test: erfinv, verdict: EXPORT_FAIL}\n')
    assert "onnx]cpu[*" in message and "not a valid glob" in message, message


def test_globs_whose_brackets_pair_are_taken(tmp_path):
    path = tmp_path / "expectations.yaml"
    path.write_text('"onnx_[c]pu_*":\n  - {test: "erf[iv]nv*", verdict: EXPORT_FAIL}\n'
                    '  - {test: "x[!]]y", verdict: EXPORT_FAIL}\n')
    assert [e.test for e in load(path, PRESETS).entries] == ["erf[iv]nv*", "x[!]]y"]


@pytest.mark.parametrize("seed", [2**63, 10**23])
def test_a_seed_beyond_the_history_column_is_refused(tmp_path, seed):
    message = _refusal(tmp_path, f"onnx_cpu_fp32:\n  - {{test: erfinv, verdict: EXPORT_FAIL, seed: {seed}}}\n")
    assert "'seed'" in message and str(2**63 - 1) in message, message


def test_the_largest_seed_is_taken(tmp_path):
    path = tmp_path / "expectations.yaml"
    path.write_text(f"onnx_cpu_fp32:\n  - {{test: erfinv, verdict: EXPORT_FAIL, seed: {2**63 - 1}}}\n")
    assert load(path, PRESETS).entries[0].seed == 2**63 - 1


# ---------------------------------------------------------------- dynamic dims

def _load(tmp_path: Path, dynamic: str, shape: str = "[B, N]"):
    from opdiff_snap.suite import load_suites

    path = tmp_path / "dyn.yaml"
    path.write_text("dims: {B: 4, N: 16, S: 6}\ntests:\n  - id: lin\n"
                    "    op: {type: module, path: torch.nn.Linear, args: [16, 8]}\n"
                    f"    in: [{{type: tensor, shape: {shape}, dtype: float32}}]\n"
                    f"    dynamic: {dynamic}\n")
    return {c.id: c for c in load_suites([path])}


def _suite_refusal(tmp_path: Path, dynamic: str) -> str:
    from opdiff_snap.core.errors import OpdiffError

    with pytest.raises(OpdiffError) as caught:
        _load(tmp_path, dynamic)
    return str(caught.value)


@pytest.mark.parametrize("dynamic", ["{S: [2, 9]}", "{B: [2, 9], S: [3, 5]}"])
def test_a_dynamic_dim_no_input_shape_uses_is_refused(tmp_path, dynamic):
    message = _suite_refusal(tmp_path, dynamic)
    assert "dyn.yaml:6" in message and "test 'lin'" in message and "no input shape" in message, message
    assert "dynamic S" in message, message


@pytest.mark.parametrize("count", [101, 200_000])
def test_more_dynamic_sizes_than_allowed_are_refused_at_once(tmp_path, count):
    import time

    sizes = ", ".join(str(n) for n in range(2, count + 2))
    start = time.monotonic()
    message = _suite_refusal(tmp_path, f"{{B: [{sizes}]}}")
    assert "dyn.yaml:6" in message and "test 'lin'" in message and "100 sizes" in message, message
    assert time.monotonic() - start < 30


def test_the_most_dynamic_sizes_allowed_are_taken(tmp_path):
    sizes = ", ".join(str(n) for n in range(2, 102))
    assert len(_load(tmp_path, f"{{B: [{sizes}]}}")) == 101
