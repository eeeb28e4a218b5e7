"""The suite commands as a user runs them: list-presets, list-tests, validate; every
malformed suite of test_suite_errors.py exits 2 with its message and no traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.cli import MODULE, run
from test_suite_errors import CASES

from opdiff_snap.backends.registry import all_presets
from opdiff_snap.cli import main

HERE = Path(__file__).resolve().parent
FULL = HERE / "suites" / "full"


def invoke_main(*args: str, cwd: Path | None = None):
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(main, list(args))
    with runner.isolated_filesystem(temp_dir=cwd):
        return runner.invoke(main, list(args))


def test_list_presets_names_every_preset_and_says_why_not():
    result = invoke_main("list-presets")
    assert result.exit_code == 0
    for preset in all_presets():
        assert preset.name in result.output
    assert "macOS" in result.output          # CoreML prediction
    assert "CUDA" in result.output or "cuda" in result.output


def test_list_tests_prints_the_expanded_ids_in_order_and_selects():
    result = invoke_main("list-tests", str(FULL / "main.yaml"))
    assert result.exit_code == 0
    ids = result.output.split()
    assert ids[:3] == ["common_add", "mul_Tensor_0", "every_node"]
    assert "lin__bias=True__in_features=N__out_features=3" in ids
    picked = invoke_main("list-tests", str(FULL / "main.yaml"), "--test-ids", "lin__*;fft", "--test-ids", "scaled")
    assert picked.output.split() == [i for i in ids if i.startswith("lin__") or i in ("fft", "scaled")]


def test_validate_a_good_suite():
    result = invoke_main("validate", str(FULL / "main.yaml"))
    assert result.exit_code == 0 and "ok:" in result.output


@pytest.mark.parametrize("name,files,field,needles", CASES, ids=[c[0] for c in CASES])
def test_every_malformed_suite_exits_2_with_its_message(tmp_path, monkeypatch, name, files, field, needles):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["validate", "s.yaml"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "s.yaml" in result.output or any((tmp_path / r).name in result.output for r in files)
    for needle in needles:
        assert needle in result.output


def test_a_real_process_prints_one_paragraph_and_a_traceback_only_with_debug(tmp_path):
    (tmp_path / "bad.yaml").write_text("tests: [{op: aten::add.Tensr, in: []}]\n")
    plain = run(tmp_path, "validate", "bad.yaml", entry=MODULE)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert "bad.yaml:1" in plain.stderr and "did you mean 'Tensor'" in plain.stderr
    debug = run(tmp_path, "--debug", "validate", "bad.yaml", entry=MODULE)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_commands_default_to_the_suites_directory(tmp_path):
    shutil.copytree(FULL, tmp_path / "suites")
    result = run(tmp_path, "list-tests", entry=MODULE)
    assert result.returncode == 0 and "common_add" in result.stdout
    empty = run(tmp_path / "suites", "list-tests", entry=MODULE)
    assert empty.returncode == 2 and "no suites" in empty.stderr
