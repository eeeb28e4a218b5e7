"""Numbers a user gives: every numeric flag of every command, the numeric `[tool.opdiff]`
settings, `--seed-list`, numeric preset options and the pytest plugin's `--opdiff-jobs`
are checked where they are read: finite, in range, whole where a count is meant. A bad one
is one line naming the flag (or the file and key, or the preset and option), exit 2,
before anything runs.

The project here has no suites and no goldens, so a value that got through would end in
some other error, never in a run (a `--timeout-s nan` that got through once hung)."""

from __future__ import annotations

import subprocess

import pytest
from helpers.cli import PY, invoke
from helpers.hostile import assert_clean_failure, env, snapshot

HUGE = "9" * 30
NOT_FINITE = ["nan", "inf", "-inf", "1e400"]
CASES: list[tuple[tuple[str, ...], str, str, str]] = []   # (command, flag as named, value, reason)


def _flag(command: tuple[str, ...], flag: str, names: str, kind: str) -> None:
    """The bad values of one numeric flag of one command."""
    whole = kind.startswith("whole")
    bad = [(v, "not a whole number" if whole else "not a finite number") for v in NOT_FINITE] + [("ten", "not a number")]
    if kind == "whole1":        # a count from 1
        bad += [("0", "out of range"), ("-1", "out of range"), ("1.5", "not a whole number"), (HUGE, "out of range")]
    elif kind == "whole0":      # a count from 0, or a seed
        bad += [("-1", "out of range"), ("2.5", "not a whole number"), (HUGE, "out of range")]
    elif kind == "timeout":
        bad += [("0", "out of range"), ("-1", "out of range"), ("1e308", "out of range"), (HUGE, "out of range")]
    elif kind == "non-negative":
        bad += [("-1", "out of range"), ("-1e-9", "out of range")]
    elif kind == "positive":
        bad += [("0", "out of range"), ("-1", "out of range")]
    for value, reason in bad:
        CASES.append((command, flag, value, f"{names} {value!r}: {reason}"))


CHECK = ("check", "-b", "torch_cpu_fp32")
UPGRADE = ("upgrade", "--with", "onnxruntime==1.30.0", "-b", "onnx_cpu_fp32")
for _cmd, _flags in [
    (("validate", "--imports"), [("--timeout-s", "--timeout-s", "timeout")]),
    (("record",), [("--timeout-s", "--timeout-s", "timeout"), ("-j", "-j/--jobs", "whole1"),
                   ("--repeats", "--repeats", "whole1"), ("--warmup", "--warmup", "whole0"),
                   ("--seeds", "--seeds", "whole1"), ("--num-sampled-inputs", "--num-sampled-inputs", "whole1")]),
    (CHECK, [("--atol", "--atol", "non-negative"), ("--rtol", "--rtol", "non-negative"),
             ("--baseline-factor", "--baseline-factor", "non-negative"), ("--timeout-s", "--timeout-s", "timeout"),
             ("--jobs", "-j/--jobs", "whole1"), ("--repeats", "--repeats", "whole1"),
             ("--seeds", "--seeds", "whole1")]),
    (UPGRADE, [("--timeout-s", "--timeout-s", "timeout"), ("--drift-factor", "--drift-factor", "positive"),
               ("--latency-threshold", "--latency-threshold", "non-negative"), ("--warmup", "--warmup", "whole0")]),
    (("localize", "add", "-b", "torch_cpu_fp32"), [("--seed", "--seed", "whole0"), ("--atol", "--atol", "non-negative"),
                                                   ("--timeout-s", "--timeout-s", "timeout"),
                                                   ("-j", "-j/--jobs", "whole1")]),
    (("repro", "add", "-b", "torch_cpu_fp32"), [("--seed", "--seed", "whole0")]),
    (("gradcheck",), [("--eps", "--eps", "positive"), ("--max-entries", "--max-entries", "whole1"),
                      ("--seed", "--seed", "whole0")]),
    (("goldens", "show", "add"), [("--seed", "--seed", "whole0")]),
    (("goldens", "reference"), [("-j", "-j/--jobs", "whole1")]),
    (("diff-runs", "a", "b"), [("--drift-factor", "--drift-factor", "positive"),
                               ("--latency-threshold", "--latency-threshold", "non-negative")]),
    (("report", "upgrade", "a", "b"), [("--drift-factor", "--drift-factor", "positive")]),
]:
    for _given, _names, _kind in _flags:
        _flag(_cmd + (_given,), _given, _names, _kind)


@pytest.fixture
def empty(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    return project


@pytest.mark.parametrize("command, flag, value, fragment", CASES,
                         ids=[f"{' '.join(c[:2])} {f}={v}" for c, f, v, _ in CASES])
def test_numeric_flags_are_checked_when_parsed(empty, command, flag, value, fragment):
    before = snapshot(empty)
    code, out, err = invoke(empty, *command, value)
    assert_clean_failure(code, out, err, 2, f"opdiff: error: {fragment}")
    assert len(err.strip().splitlines()) == 1, err
    assert snapshot(empty) == before


@pytest.mark.parametrize("seeds, fragment", [
    ("1,-2", "seed '-2': out of range"),
    (f"0,{HUGE}", f"seed '{HUGE}': out of range"),
    ("0,1e400", "seed '1e400': not a whole number"),
    ("0,nan", "seed 'nan': not a whole number"),
    ("0,x", "seed 'x': not a number"),
])
@pytest.mark.parametrize("command", [("record",), CHECK], ids=["record", "check"])
def test_seed_list_values_are_checked(empty, command, seeds, fragment):
    code, out, err = invoke(empty, *command, "--seed-list", seeds)
    assert_clean_failure(code, out, err, 2, f"--seed-list {seeds!r}: {fragment}")


@pytest.mark.parametrize("shard, fragment", [
    (f"1/{HUGE}", "the number of shards N is out of range; give a whole number from 1 to 1024"),
    ("1/1025", "the number of shards N is out of range; give a whole number from 1 to 1024"),
    (f"{'9' * 5000}/4", "write K/N with 1 <= K <= N"),
    ("0/4", "write K/N with 1 <= K <= N"),
])
def test_shard_counts_are_checked(empty, shard, fragment):
    code, out, err = invoke(empty, *CHECK, "--run-group", "g", "--shard", shard)
    assert_clean_failure(code, out, err, 2, f"opdiff: error: --shard {shard!r}: {fragment}")


SETTINGS = [
    ("timeout_s = nan", "timeout_s must be a finite number of seconds from 0.1 to 604800, not nan"),
    ("timeout_s = inf", "timeout_s must be a finite number of seconds from 0.1 to 604800, not inf"),
    ("timeout_s = 1e400", "timeout_s must be a finite number of seconds from 0.1 to 604800, not inf"),
    ("timeout_s = 0", "timeout_s must be a finite number of seconds from 0.1 to 604800, not 0"),
    ("timeout_s = 1e300", "timeout_s must be a finite number of seconds from 0.1 to 604800, not 1e+300"),
    ("jobs = 0", "jobs must be a whole number from 1 to 1024, not 0"),
    ("jobs = 2.5", "jobs must be a whole number from 1 to 1024, not 2.5"),
    ("jobs = 9223372036854775807", "jobs must be a whole number from 1 to 1024, not 9223372036854775807"),
    ("jobs = true", "jobs must be a whole number from 1 to 1024, not True"),
    ("repeats = -1", "repeats must be a whole number from 1 to 10000, not -1"),
    ("warmup = -1", "warmup must be a whole number from 0 to 10000, not -1"),
    ("warmup = nan", "warmup must be a whole number from 0 to 10000, not nan"),
]


@pytest.mark.parametrize("line, fragment", SETTINGS, ids=[s for s, _ in SETTINGS])
@pytest.mark.parametrize("command", [("goldens", "ls"), ("record",)], ids=["goldens-ls", "record"])
def test_numeric_settings_are_checked(empty, line, fragment, command):
    (empty / "pyproject.toml").write_text(f"[tool.opdiff]\n{line}\n")
    before = snapshot(empty)
    code, out, err = invoke(empty, *command)
    assert_clean_failure(code, out, err, 2, f"pyproject.toml: [tool.opdiff] {fragment}.")
    assert snapshot(empty) == before


OPTIONS = [
    ('{"opset": NaN}', "option 'opset': NaN is not a finite number"),
    ('{"opset": Infinity}', "option 'opset': Infinity is not a finite number"),
    ('{"opset": 1e400}', "option 'opset': Infinity is not a finite number"),
    ('{"opset": 18.5}', "option 'opset': 18.5 is not a whole number"),
    ('{"opset": 0}', "option 'opset': 0 is out of range"),
    ('{"opset": ' + HUGE + "}", f"option 'opset': {HUGE} is out of range"),
    ('{"intra_op_num_threads": -1}', "option 'intra_op_num_threads': -1 is out of range"),
    ('{"inter_op_num_threads": 1000000000}', "option 'inter_op_num_threads': 1000000000 is out of range"),
    ('{"providers": [NaN]}', "option 'providers': item 0: NaN is not a finite number"),
]


@pytest.mark.parametrize("options, fragment", OPTIONS, ids=[o for o, _ in OPTIONS])
def test_numeric_preset_options_are_checked(empty, options, fragment):
    code, out, err = invoke(empty, "check", "-b", "onnx_cpu_fp32", "--preset-options", f"onnx_cpu_fp32={options}")
    assert_clean_failure(code, out, err, 2, f"preset 'onnx_cpu_fp32': {fragment}")


def test_pytest_plugin_jobs_are_checked(empty):
    proc = subprocess.run([PY, "-m", "pytest", "-p", "no:cacheprovider", "--opdiff-jobs", HUGE], cwd=empty,
                          capture_output=True, text=True, env=env(), timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert f"--opdiff-jobs: '{HUGE}': out of range; give a whole number from 1 to 1024" in proc.stderr
