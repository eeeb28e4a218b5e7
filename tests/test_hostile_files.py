"""Special files, deep JSON and oversized or mistyped preset options: each is refused
with exit 2 naming the file, flag or option, or (a suite-cache entry) ignored, and
nothing blocks or reads without end. A CLI call that could block runs in a subprocess
with a timeout, so a regression (a FIFO blocks open() for ever) fails instead of hanging."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.cli import invoke, run
from helpers.hostile import FAST, assert_clean_failure, copy_project, env, make_project, run_cli

QUICK = 120   # seconds: what a refusal takes at most, torch's import included
CHECK = ("check", "-b", "torch_cpu_fp32", "--test-ids", "add", *FAST)
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    project = make_project(tmp_path_factory.mktemp("files") / "p")
    proc = run_cli(project, "record", "--test-ids", "add;relu", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project


@pytest.fixture
def project(recorded, tmp_path) -> Path:
    return copy_project(recorded, tmp_path / "p")


def _fifo(project: Path, name: str = "pipe") -> Path:
    path = project / name
    os.mkfifo(path)
    return path


def _cli(project: Path, *args: str, extra_env: dict[str, str] | None = None, timeout: float = QUICK):
    """The CLI in a real process with `extra_env` set: a timeout fails the test rather than hanging it."""
    return run(project, *args, env={**env(), **(extra_env or {})}, timeout=timeout)


def _refused(proc, *fragments: str) -> None:
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 2, *fragments)


# ---------------------------------------------------------------- files written

@needs_fifo
@pytest.mark.parametrize("how", ["--summary-md", "GITHUB_STEP_SUMMARY", "--junit"])
def test_an_output_that_is_a_fifo_is_refused_before_the_run(project, how):
    pipe = _fifo(project)
    if how == "GITHUB_STEP_SUMMARY":
        proc = _cli(project, *CHECK, extra_env={"GITHUB_STEP_SUMMARY": str(pipe)})
    else:
        proc = _cli(project, *CHECK, how, str(pipe))
    _refused(proc, how, str(pipe), "named pipe")
    assert "PASS" not in proc.stdout   # refused before anything ran


@needs_fifo
def test_report_html_into_a_fifo_is_refused(project):
    pipe = _fifo(project)
    _refused(_cli(project, "report", "html", "-o", str(pipe)), "-o/--output", "named pipe")


def test_an_output_that_is_a_device_is_refused(project):
    code, out, err = invoke(project, *CHECK, "--junit", "/dev/null")
    assert_clean_failure(code, out, err, 2, "--junit", "/dev/null", "a device")


# ---------------------------------------------------------------- files read

@needs_fifo
@pytest.mark.parametrize("flag", ["--backend-overrides-file", "--preset-options"])
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_an_options_file_that_is_a_fifo_is_refused(project, flag, suffix):
    pipe = _fifo(project, "opts" + suffix)
    value = str(pipe) if flag != "--preset-options" else f"torch_cpu_fp32={pipe}"
    _refused(_cli(project, *CHECK, flag, value), "opts" + suffix, "named pipe")


@pytest.mark.parametrize("flag", ["--backend-overrides-file", "--preset-options"])
def test_an_options_file_that_is_a_device_is_refused(project, flag):
    value = "/dev/zero" if flag != "--preset-options" else "torch_cpu_fp32=/dev/zero"
    code, out, err = invoke(project, *CHECK, flag, value)
    assert_clean_failure(code, out, err, 2, "/dev/zero", "a device")


def test_a_huge_options_file_is_refused_without_reading_it(project):
    big = project / "big.json"
    with open(big, "wb") as f:
        f.truncate(1 << 30)   # sparse: 1 GB that costs nothing to make
    code, out, err = invoke(project, *CHECK, "--preset-options", f"torch_cpu_fp32={big}")
    assert_clean_failure(code, out, err, 2, "big.json", "larger than")


def _replace_cache_entries(project: Path, make) -> int:
    """Each entry of the suite cache a check keeps (entries are named by the folder) made anew by `make`."""
    proc = run_cli(project, *CHECK)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entries = list((project / ".opdiff-cache").rglob("suites/*.json"))
    for entry in entries:
        entry.unlink()
        make(entry)
    return len(entries)


@needs_fifo
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_suite_cache_entry_of_the_wrong_kind_is_ignored(project, kind):
    make = {"fifo": os.mkfifo, "dev_zero": lambda p: p.symlink_to("/dev/zero")}[kind]
    assert _replace_cache_entries(project, make) > 0
    proc = _cli(project, *CHECK, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- suite arguments

@needs_fifo
@pytest.mark.parametrize("command", [CHECK, ("validate",)])
def test_a_suite_argument_that_is_a_fifo_is_refused(project, command):
    pipe = _fifo(project, "suite.yaml")
    _refused(_cli(project, *command, str(pipe)), "suite.yaml", "named pipe")


@pytest.mark.parametrize("command", [CHECK, ("validate",)])
def test_a_suite_argument_that_is_a_device_is_refused(project, command):
    code, out, err = invoke(project, *command, "/dev/null")
    assert_clean_failure(code, out, err, 2, "/dev/null", "a device")


# ---------------------------------------------------------------- deep JSON

def _deep(levels: int) -> str:
    return '{"providers": ' + "[" * levels + "]" * levels + "}"


@pytest.mark.parametrize("where", ["file", "inline", "overrides-json"])
def test_deeply_nested_options_are_refused(project, where):
    if where == "file":
        path = project / "deep.json"
        path.write_text(_deep(900))
        flag, value = "--preset-options", f"onnx_cpu_fp32={path}"
    elif where == "inline":
        flag, value = "--preset-options", "onnx_cpu_fp32=" + _deep(100_000)
    else:
        flag, value = "--backend-overrides-json", _deep(100_000)
    code, out, err = invoke(project, "check", "-b", "onnx_cpu_fp32", "--test-ids", "add", *FAST, flag, value)
    assert_clean_failure(code, out, err, 2, "nested deeper than 200 levels")


def test_a_deep_suite_cache_entry_is_ignored(project):
    assert _replace_cache_entries(project, lambda p: p.write_text("[" * 100_000 + "]" * 100_000)) > 0
    code, out, err = invoke(project, *CHECK)
    assert code == 0, out + err


# ---------------------------------------------------------------- int8 options' kinds and ranges

def _preset_refusal(preset: str, options: dict) -> str:
    from opdiff_snap.backends.registry import get_preset
    from opdiff_snap.core.errors import OpdiffError

    with pytest.raises(OpdiffError) as caught:
        get_preset(preset, options)
    return str(caught.value)


@pytest.mark.parametrize("value", [-1, -0.5])
def test_a_negative_steps_option_is_refused_like_a_suite_tolerance(value):
    message = _preset_refusal("onnx_cpu_int8", {"steps": value})
    assert "option 'steps'" in message and ">= 0" in message, message


def test_a_negative_steps_option_exits_2(project):
    code, out, err = invoke(project, "check", "-b", "onnx_cpu_int8", "--test-ids", "add", *FAST,
                            "--preset-options", 'onnx_cpu_int8={"steps": -1}')
    assert_clean_failure(code, out, err, 2, "onnx_cpu_int8", "option 'steps'")


@pytest.mark.parametrize("preset", ["onnx_cpu_int8", "executorch_cpu_int8"])
@pytest.mark.parametrize("option, value", [
    ("min_sqnr", "x"), ("min_sqnr", [1]), ("min_sqnr", {}), ("min_sqnr", True),
    ("per_channel", "yes"), ("per_channel", 1), ("per_channel", [True]),
])
def test_int8_options_of_the_wrong_kind_are_refused(preset, option, value):
    message = _preset_refusal(preset, {option: value})
    assert f"option '{option}'" in message and "null" in message, message


def test_int8_options_of_the_right_kind_are_taken():
    from opdiff_snap.backends.registry import get_preset

    preset = get_preset("onnx_cpu_int8", {"min_sqnr": 20, "per_channel": False, "steps": 0})
    assert (preset.options["min_sqnr"], preset.options["per_channel"], preset.options["steps"]) == (20, False, 0)
    preset = get_preset("onnx_cpu_int8", {"min_sqnr": None, "per_channel": None})
    assert preset.options["min_sqnr"] is None and preset.options["per_channel"] is None


def test_an_int8_option_of_the_wrong_kind_exits_2(project):
    code, out, err = invoke(project, "check", "-b", "onnx_cpu_int8", "--test-ids", "add", *FAST,
                            "--preset-options", 'onnx_cpu_int8={"min_sqnr": "x"}')
    assert_clean_failure(code, out, err, 2, "onnx_cpu_int8", "min_sqnr")


# ---------------------------------------------------------------- option sizes and the history

ONNX_CHECK = ("check", "-b", "onnx_cpu_fp32", "--test-ids", "add", *FAST)


def test_an_oversized_option_is_refused_before_it_reaches_the_history(project):
    path = project / "many.json"
    path.write_text(json.dumps({"providers": ["CPUExecutionProvider"] * 100_000}))   # 2.4 MB
    runs = set((project / "store" / "runs").iterdir())
    code, out, err = invoke(project, *ONNX_CHECK, "--preset-options", f"onnx_cpu_fp32={path}")
    assert_clean_failure(code, out, err, 2, "onnx_cpu_fp32", "bytes as JSON", "1,048,576")
    assert set((project / "store" / "runs").iterdir()) == runs


def test_a_yaml_alias_bomb_in_an_overrides_file_is_refused(project):
    levels = ["a0: &a0 [" + ", ".join(['"' + "x" * 40 + '"'] * 10) + "]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    path = project / "bomb.yaml"
    path.write_text("\n".join(levels) + "\nonnx_cpu_fp32: {providers: *a6}\n")
    assert path.stat().st_size < 1000
    code, out, err = invoke(project, *ONNX_CHECK, "--backend-overrides-file", str(path))
    assert_clean_failure(code, out, err, 2, "bomb.yaml", "1,000,000 values")


def test_a_history_line_past_its_bound_is_skipped_with_a_warning(project):
    from opdiff_snap.core.limits import MAX_HISTORY_LINE_BYTES

    runs = project / "store" / "runs"
    good = sorted(runs.iterdir())[0]
    lines = good.read_text().splitlines()
    meta = json.loads(lines[0])
    meta["run_id"] = "20990101T000000Z-bad000"
    meta["padding"] = "x" * (2 * MAX_HISTORY_LINE_BYTES + 10)   # past what DuckDB reads too
    bad = runs / "20990101T000000Z-bad000.jsonl"
    bad.write_text(json.dumps(meta) + "\n")
    code, out, err = invoke(project, "query", "SELECT count(*) AS n FROM runs")
    assert_clean_failure(code, out, err, 0, "20990101T000000Z-bad000", "longer than")
    assert "1" in out   # the good run is still there


def test_no_history_line_past_its_bound_is_written(tmp_path, monkeypatch):
    from opdiff_snap.history import writer as history_writer
    from opdiff_snap.history.writer import HistoryWriteError, RunStart, RunWriter

    monkeypatch.setattr(history_writer, "MAX_HISTORY_LINE_BYTES", 4096)
    w = RunWriter.start(tmp_path / "store", RunStart("check", ["check"], [], {}, {}))
    w.item({"test_id": "a", "seed": 0, "preset": "torch_cpu_fp32", "status": "PASS"})
    with pytest.raises(HistoryWriteError) as caught:
        w.item({"test_id": "b", "seed": 0, "preset": "torch_cpu_fp32", "status": "PASS", "msg": "x" * 5000})
    assert w.run_id in str(caught.value) and "4,096" in str(caught.value)
    assert "x" * 5000 not in w.path.read_text()
