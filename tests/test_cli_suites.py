"""The suite commands as a user runs them: list-presets, list-tests, validate; every
malformed suite of test_suite_errors.py exits 2 with its message and no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_suite_errors import CASES

from opdiff_snap.backends.registry import all_presets
from opdiff_snap.cli import main

HERE = Path(__file__).resolve().parent
FULL = HERE / "suites" / "full"


def run(*args: str, cwd: Path | None = None):
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(main, list(args))
    with runner.isolated_filesystem(temp_dir=cwd):
        return runner.invoke(main, list(args))


def test_list_presets_names_every_preset_and_says_why_not():
    result = run("list-presets")
    assert result.exit_code == 0
    for preset in all_presets():
        assert preset.name in result.output
    assert "macOS" in result.output          # CoreML prediction
    assert "CUDA" in result.output or "cuda" in result.output


def test_list_tests_prints_the_expanded_ids_in_order_and_selects():
    result = run("list-tests", str(FULL / "main.yaml"))
    assert result.exit_code == 0
    ids = result.output.split()
    assert ids[:3] == ["common_add", "mul_Tensor_0", "every_node"]
    assert "lin__bias=True__in_features=N__out_features=3" in ids
    picked = run("list-tests", str(FULL / "main.yaml"), "--test-ids", "lin__*;fft", "--test-ids", "scaled")
    assert picked.output.split() == [i for i in ids if i.startswith("lin__") or i in ("fft", "scaled")]


def test_validate_a_good_suite():
    result = run("validate", str(FULL / "main.yaml"))
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
    plain = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "validate", "bad.yaml"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert "bad.yaml:1" in plain.stderr and "did you mean 'Tensor'" in plain.stderr
    debug = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "--debug", "validate", "bad.yaml"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_commands_default_to_the_suites_directory(tmp_path):
    shutil.copytree(FULL, tmp_path / "suites")
    result = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "list-tests"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0 and "common_add" in result.stdout
    empty = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "list-tests"], cwd=tmp_path / "suites",
                           capture_output=True, text=True)
    assert empty.returncode == 2 and "no suites" in empty.stderr
