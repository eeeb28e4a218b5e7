"""The expectations file as hostile input: bytes that are not UTF-8 text, a file too big,
two updates at once, a planted `.tmp` symlink, characters the writer must escape to read
back, a read-only file, a hundred thousand globs, control characters on the way to the
terminal and the Markdown summary."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
import types

import pytest
from helpers.cli import PY, invoke
from helpers.hostile import FAST, assert_clean_failure, copy_project, env, make_project, run_cli

from opdiff_snap.cli.expecting import standing_lines, write_update
from opdiff_snap.cli.summary_md import markdown
from opdiff_snap.compare.results import Result
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import NOT_FAILING, Verdict
from opdiff_snap.expectations import entries as entries_module
from opdiff_snap.expectations.entries import Expectation, Expectations
from opdiff_snap.expectations.file import ExpectationsError, dump, load
from opdiff_snap.expectations.standing import Expecter
from opdiff_snap.expectations.update import update

FAILING = set(Verdict) - NOT_FAILING
PRESETS = ["onnx_cpu_fp32", "torch_cpu_fp16"]
V = Verdict
ESC = "\x1b[31mRED\x1b]8;;http://x\x07"
GLOB_ESC = "\x1b]8;;http://x\x07\x9b31mRED"     # no '[': it stays a glob of one test
# every character the reader must get back as written: C0, DEL, C1, the YAML line breaks,
# the BOM, bidi controls, the noncharacters YAML cannot hold, quote and backslash, and
# some that need no escape
AWKWARD = ([chr(c) for c in range(0x20)] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA1)]
           + ["\u2028", "\u2029", "\ufeff", "\u200e", "\u202e", "\u2066", "\ufffe", "\uffff",
              '"', "\\", "'", "#", ": ", "{", "}", ",", "é", "\U0001f600", "\U0010ffff", " "])


def _r(test: str, verdict: Verdict, preset: str = "onnx_cpu_fp32", seed: int = 0) -> Result:
    return Result(test, seed, preset, verdict)


# ----------------------------------------------------------------- bytes that are not text


@pytest.mark.parametrize("content", [
    b'onnx_cpu_fp32:\n  - {test: erfinv, verdict: EXPORT_FAIL, reason: "caf\xe9"}\n',
    'onnx_cpu_fp32:\n  - {test: erfinv, verdict: EXPORT_FAIL, reason: "café"}\n'.encode("utf-16"),
    None,   # over the size guard
], ids=["latin1", "utf16", "20MB"])
def test_an_expectations_file_not_utf8_or_too_big_is_refused_naming_it(tmp_path, content):
    project = make_project(tmp_path / "p")
    path = project / "exp.yaml"
    if content is None:
        with open(path, "wb") as f:
            f.write(b"# " + b"x" * (20 * 2**20) + b"\n")
    else:
        path.write_bytes(content)
    with pytest.raises(ExpectationsError) as err:
        load(path, PRESETS)
    assert "exp.yaml" in str(err.value) and "expectations file" in str(err.value)
    assert "suite" not in str(err.value)
    code, out, errout = invoke(project, "check", "-b", "onnx_cpu_fp32", "--expectations", "exp.yaml")
    assert_clean_failure(code, out, errout, 2, "exp.yaml", "expectations file")


def test_pytest_opdiff_refuses_an_expectations_file_not_utf8_without_a_traceback(tmp_path):
    project = make_project(tmp_path / "p")
    (project / "expectations.yaml").write_bytes(b'onnx_cpu_fp32:\n  - {test: add, verdict: CRASH, reason: "\xe9"}\n')
    proc = subprocess.run([PY, "-m", "pytest", "--opdiff", "-b", "onnx_cpu_fp32", "-p", "no:cacheprovider", "-q"],
                          cwd=project, capture_output=True, text=True, env=env(), timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "INTERNALERROR" not in text and "Traceback" not in text, text
    assert "expectations.yaml" in text and "not UTF-8" in text, text


# ----------------------------------------------------------------- the update's write


def test_a_read_only_expectations_file_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "expectations.yaml"
    path.write_text("onnx_cpu_fp32:\n  - {test: a, verdict: CRASH}\n")
    os.chmod(path, 0o444)
    before = path.read_bytes()
    with pytest.raises(OpdiffError) as err:
        write_update([_r("b", V.CRASH)], FAILING, path)
    assert err.value.exit_code == 2
    assert str(path) in str(err.value) and "read-only" in str(err.value)
    assert path.read_bytes() == before and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expectations.yaml"]


def test_check_refuses_to_update_a_read_only_expectations_file_before_it_runs(tmp_path):
    project = make_project(tmp_path / "p")
    path = project / "expectations.yaml"
    path.write_text("")
    os.chmod(path, 0o444)
    code, out, errout = invoke(project, "check", "-b", "onnx_cpu_fp32", "--update-expectations")
    assert_clean_failure(code, out, errout, 2, "expectations.yaml", "read-only", "chmod")
    assert path.read_bytes() == b"" and stat.S_IMODE(path.stat().st_mode) == 0o444
    assert not (project / "store").exists()      # nothing ran


def test_two_updates_at_once_keep_both_presets_entries(tmp_path):
    """Each run read the file before it ran; both write at the same moment."""
    path = tmp_path / "expectations.yaml"
    path.write_text("onnx_cpu_fp32:\n  - {test: kept, verdict: CRASH, reason: mine}\n")
    runs = {"onnx_cpu_fp32": [_r("a", V.EXPORT_FAIL), _r("b", V.MISMATCH)],
            "torch_cpu_fp16": [_r("a", V.MISMATCH, "torch_cpu_fp16"), _r("c", V.CRASH, "torch_cpu_fp16")]}
    barrier, said, errors = threading.Barrier(len(runs)), {}, []

    def one(preset: str) -> None:
        barrier.wait()
        try:
            said[preset] = write_update(runs[preset], FAILING, path, start[preset])
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    for _ in range(5):
        path.write_text("onnx_cpu_fp32:\n  - {test: kept, verdict: CRASH, reason: mine}\n")
        start = {p: load(path, PRESETS) for p in runs}     # what each run read before it ran
        threads = [threading.Thread(target=one, args=(p,)) for p in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert all("updated" in lines[0] for lines in said.values()), said
        assert {(e.preset, e.test, e.reason) for e in load(path, PRESETS).entries} == {
            ("onnx_cpu_fp32", "kept", "mine"), ("onnx_cpu_fp32", "a", ""), ("onnx_cpu_fp32", "b", ""),
            ("torch_cpu_fp16", "a", ""), ("torch_cpu_fp16", "c", "")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expectations.yaml"]


def test_a_planted_tmp_symlink_is_neither_followed_nor_made_the_file(tmp_path):
    project, outside = tmp_path / "p", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    path = project / "expectations.yaml"
    path.write_text("onnx_cpu_fp32:\n  - {test: a, verdict: CRASH}\n")
    os.chmod(path, 0o640)
    (project / "expectations.yaml.tmp").symlink_to(outside / "target.yaml")
    lines = write_update([_r("b", V.CRASH)], FAILING, path)
    assert "updated" in lines[0]
    assert not path.is_symlink() and path.is_file()
    assert {e.test for e in load(path, PRESETS).entries} == {"a", "b"}
    assert list(outside.iterdir()) == []
    assert (project / "expectations.yaml.tmp").is_symlink()          # left as it was
    assert stat.S_IMODE(path.stat().st_mode) == 0o640                 # the file keeps its mode
    assert sorted(p.name for p in project.iterdir()) == ["expectations.yaml", "expectations.yaml.tmp"]


# ----------------------------------------------------------------- what is written reads back


@pytest.mark.parametrize("char", AWKWARD, ids=[f"U{ord(c):04X}" if len(c) == 1 else repr(c) for c in AWKWARD])
def test_whatever_the_writer_emits_reads_back_identically(tmp_path, char):
    written = [Expectation("onnx_cpu_fp32", f"t{char}x", V.CRASH, reason=f"r{char}s"),
               Expectation("onnx_cpu_fp32", f"g{char}*", V.MISMATCH, reason=f"{char}"),
               Expectation("onnx_cpu_fp32", char, V.TIMEOUT, seed=1, reason=f" {char}{char} ")]
    path = tmp_path / "expectations.yaml"
    path.write_bytes(dump(Expectations(written)).encode("utf-8"))
    read = load(path, PRESETS)
    assert sorted((e.test, e.reason, e.seed) for e in read.entries) == sorted((e.test, e.reason, e.seed)
                                                                               for e in written)
    text = path.read_text(encoding="utf-8")
    assert text.isascii() or all(c.isprintable() or c == "\n" for c in text)   # escaped, not raw


def test_a_lone_surrogate_no_yaml_file_can_hold_is_refused_not_written(tmp_path):
    with pytest.raises(OpdiffError) as err:
        dump(Expectations([Expectation("onnx_cpu_fp32", "t\ud800", V.CRASH)]))
    assert "U+D800" in str(err.value) and err.value.exit_code == 2


# ----------------------------------------------------------------- to the terminal and the summary


def test_control_characters_of_an_expectation_reach_no_output_raw():
    expired = Expectation("onnx_*", f"x{GLOB_ESC}*", V.MISMATCH, reason=f"why{ESC}", until="onnxruntime<0.1", line=3)
    held = Expectation("onnx_cpu_fp32", "relu", V.CRASH, reason=f"because{ESC}")
    exps = Expectations([expired, held], f"exp{ESC}.yaml")
    results = [_r(f"x{GLOB_ESC}1", V.PASS), _r("relu", V.CRASH)]
    report = Expecter(exps, FAILING, version_of=lambda _: "1.0").report(results)
    assert report.expired == [expired]
    lines = standing_lines(report, True, "opdiff check")
    run = types.SimpleNamespace(results=results, command="check", run_id="r", wall_s=1.0, path="store")
    summary = markdown(run, FAILING, report)
    for text in ("\n".join(lines), summary):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, text
    assert any(line.startswith("expired:") and "x\\x1b]8;;http://x\\x07\\x9b31mRED*" in line for line in lines), lines
    assert "because\\" in summary and "x1b[31mRED" in summary and "x9b31mRED*" in summary, summary
    changes = update(Expectations([Expectation("onnx_cpu_fp32", f"y{ESC}", V.CRASH)]),
                     [_r(f"y{ESC}", V.PASS), _r(f"z{ESC}", V.CRASH)], FAILING)[1]
    assert all("\x1b" not in line for line in changes.lines()) and len(changes.lines()) == 2


# ----------------------------------------------------------------- what the file may name


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A project with goldens of add, relu, scale and big."""
    project = make_project(tmp_path_factory.mktemp("recorded") / "p")
    proc = run_cli(project, "record", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return project


def test_a_test_glob_that_matches_no_test_of_the_project_is_refused_before_the_check(recorded, tmp_path):
    project = copy_project(recorded, tmp_path / "p")
    (project / "expectations.yaml").write_text('torch_cpu_fp32:\n  - {test: "sc*", verdict: CRASH}\n'
                                               '  - {test: "nosuch*", verdict: CRASH}\n'
                                               '  - {test: "re[xyz]u", verdict: CRASH}\n')
    runs = sorted((project / "store").rglob("*.jsonl"))
    code, out, err = invoke(project, "check", "-b", "torch_cpu_fp32", *FAST, "--in-process")
    assert_clean_failure(code, out, err, 2, "expectations.yaml:3", "'nosuch*' matches no test",
                         "expectations.yaml:4", "'re[xyz]u'")
    assert "sc*" not in out + err
    assert sorted((project / "store").rglob("*.jsonl")) == runs      # nothing ran
    # a check of some suites only may meet an entry about others: it is not judged there
    (project / "expectations.yaml").write_text('torch_cpu_fp32:\n  - {test: "nosuch*", verdict: CRASH}\n')
    code, out, err = invoke(project, "check", "-b", "torch_cpu_fp32", *FAST, "--in-process", "suites/s.yaml")
    assert code == 0, out + err


# ----------------------------------------------------------------- many globs


def test_a_lookup_among_100k_globs_examines_only_those_that_can_match(monkeypatch):
    many = Expectations([Expectation("onnx_cpu_fp32", f"op{i}_*", V.MISMATCH) for i in range(100_000)]
                        + [Expectation("onnx_cpu_fp32", "relu", V.CRASH), Expectation("onnx_*", "*_z", V.CRASH)])
    examined = []
    real_names, real_fnmatch = Expectation.names, entries_module.fnmatch.fnmatchcase
    monkeypatch.setattr(Expectation, "names", lambda self, *a: examined.append(self) or real_names(self, *a))
    monkeypatch.setattr(entries_module.fnmatch, "fnmatchcase", lambda *a: examined.append(a) or real_fnmatch(*a))
    results = [_r("op5_x", V.MISMATCH), _r("relu", V.CRASH), _r("op99999_y", V.PASS), _r("q_z", V.CRASH)] + \
        [_r(f"other{i}", V.PASS) for i in range(5)]
    assert many.match("onnx_cpu_fp32", "op5_x", 0).test == "op5_*"
    assert many.match("onnx_cpu_fp32", "op5", 0) is None
    assert many.match("onnx_cpu_fp32", "op5_z", 0).test == "op5_*"       # of equal specificity, the first
    assert [e.test for e in many.about(["onnx_cpu_fp32"], ["op7_a", "relu", "x"])] == ["op7_*", "relu"]
    report = Expecter(many, FAILING).report(results)
    assert len(report.judged) == 9
    after, changes = update(many, results, FAILING)
    assert [e.test for e in changes.globs_passing] == ["op99999_*"]
    assert len(after) == len(many)
    assert len(examined) < 300, len(examined)
