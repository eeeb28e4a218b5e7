"""Control characters and markup in text: a suite may not give a test an id holding them,
and whatever comes from a golden or the history (test ids, messages, versions, run
metadata) reaches the terminal, JUnit XML, HTML and JSON only escaped.

The hostile id below holds a colour sequence, an OSC 8 hyperlink (ESC ] ... BEL), a NUL,
rich markup, a bidi override and matplotlib math; it is planted in a golden stored under
the key that id belongs to, as someone with write access to a shared store could. The store
then never takes it for a test id (the golden is CORRUPT under its key, the claimed id
quoted escaped in the message); so that the history-reading commands meet it as text, the
fixture's run file is then edited to carry it as that result's id, as someone with write
access to a shared history could."""

from __future__ import annotations

import ast
import html
import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.cli import PY, invoke, run
from helpers.hostile import (
    FAST,
    assert_clean_failure,
    copy_project,
    env,
    snapshot,
    tree_bytes,
)

from opdiff_snap.compare.results import Result
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.goldens import store_key
from opdiff_snap.pytest_plugin.outcomes import describe

EVIL = "relu\x1b[31mRED\x1b]8;;http://x\x07L\x1b]8;;\x07\x00[bold]B[/bold]$\\frac{$\u202e"
# how every text output shows it: each acting character as a visible escape
SHOWN = "relu\\x1b[31mRED\\x1b]8;;http://x\\x07L\\x1b]8;;\\x07\\x00[bold]B[/bold]$\\frac{$\\u202e"
RAW = ("\x1b", "\x00", "\x07", "\u202e")
# how the store names the golden lying under that id's key: never by the id it claims
UNKNOWN = f"<unknown: {store_key(EVIL, 0)}>"
CLAIMED = "its test_id 'relu\\x1b[31mRED\\x1b]8;;http://x\\x07L"
# C0 but newline, DEL, C1, bidi controls, line and paragraph separators
ACTING = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")

SUITE = """\
tests:
  - id: add
    op: aten::add.Tensor
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal},
         {type: tensor, shape: [2, 4], dtype: float32, init: normal}]
  - id: relu
    op: aten::relu
    in: [{type: tensor, shape: [2, 4], dtype: float32, init: normal}]
"""


def no_raw(text: str) -> None:
    """Not one of the hostile id's acting characters is in `text`."""
    found = [c for c in RAW if c in text]
    assert not found, f"raw {found!r} in:\n{text[-3000:]!r}"


@pytest.fixture(autouse=True)
def plain_terminal(monkeypatch):
    """Output as in a log: rich draws no colour of its own, so any ESC in it came from data."""
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    monkeypatch.delenv("FORCE_COLOR", raising=False)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """add and relu recorded, then relu's golden moved to the hostile id (its key and its
    `test_id` attribute), and one check run from the goldens alone into the history."""
    root = tmp_path_factory.mktemp("text") / "p"
    (root / "suites").mkdir(parents=True)
    (root / "suites" / "s.yaml").write_text(SUITE)
    proc = run(root, "record", *FAST, env=env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    old, new = root / "goldens" / store_key("relu", 0), root / "goldens" / store_key(EVIL, 0)
    meta = json.loads((old / "zarr.json").read_text())
    meta["attributes"]["test_id"] = EVIL
    (old / "zarr.json").write_text(json.dumps(meta))
    old.rename(new)
    proc = run(root, "--suites", "none", "check", "-b", "torch_cpu_fp32", *FAST, env=env())
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    (run_file,) = [p for p in (root / "store" / "runs").glob("*.jsonl") if '"command": "check"' in p.read_text()]
    lines = [json.loads(line) for line in run_file.read_text().splitlines()]
    for line in lines:
        if line.get("type") == "item" and line["id"] == UNKNOWN:
            line["id"] = EVIL
    run_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


@pytest.fixture
def project(recorded, tmp_path) -> Path:
    return copy_project(recorded, tmp_path / "p")


# ---------------------------------------------------------------- suites refuse such ids

@pytest.mark.parametrize("escape, code", [("\\e", "U+001B"), ("\\0", "U+0000"), ("\\x9b", "U+009B"),
                                          ("\\u202e", "U+202E"), ("\\L", "U+2028"), ("\\x7f", "U+007F")],
                         ids=["ESC", "NUL", "CSI", "RLO", "LINE-SEPARATOR", "DEL"])
@pytest.mark.parametrize("command", [("validate",), ("record", *FAST)], ids=["validate", "record"])
def test_a_suite_id_with_a_control_character_is_refused(tmp_path, escape, code, command):
    project = tmp_path / "p"
    (project / "suites").mkdir(parents=True)
    (project / "suites" / "ctl.yaml").write_text(
        f'tests:\n  - id: "bad{escape}id"\n    op: aten::relu\n'
        "    in: [{type: tensor, shape: [2], dtype: float32}]\n")
    before = snapshot(project)
    code_, out, err = invoke(project, *command)
    assert_clean_failure(code_, out, err, 2, f"holds {code}, a control, bidi or line-separator character")
    assert "suites/ctl.yaml:2:" in err and "tests[0].id" in err
    assert "'bad\\" in err       # the id, shown escaped
    acting = ACTING.findall(out + err)
    assert not acting, acting
    assert snapshot(project) == before    # nothing recorded, no run file


# ---------------------------------------------------------------- goldens and history show it escaped

def test_check_from_a_golden_with_a_hostile_id(project):
    """The golden is CORRUPT under its key (the id it claims is no test id); the claimed id
    is quoted escaped in the progress lines, the summary and JUnit XML, which stays
    well-formed."""
    goldens = tree_bytes(project / "goldens")
    code, out, err = invoke(project, "--suites", "none", "check", "-b", "torch_cpu_fp32", "--junit", "j.xml",
                                *FAST)
    assert code == 1, out + err
    no_raw(out + err)
    assert f"CORRUPT            {UNKNOWN} seed=0" in out and CLAIMED in out
    assert "[bold]B[/bold]" in out          # markup shown as written, not applied
    text = (project / "j.xml").read_text(encoding="utf-8")
    no_raw(text)
    cases = {c.get("name"): c for c in ET.parse(project / "j.xml").getroot().iter("testcase")}
    case = cases[f"{UNKNOWN}[seed=0]"]
    assert case.find("failure").get("type") == "CORRUPT"
    assert CLAIMED in case.find("failure").text
    assert tree_bytes(project / "goldens") == goldens


def test_check_json_carries_the_exact_id_in_json_escapes(project):
    code, out, err = invoke(project, "--suites", "none", "check", "-b", "torch_cpu_fp32", "--format", "json",
                                *FAST)
    assert code == 1, out + err
    no_raw(out + err)
    results = json.loads(out)["results"]
    assert {r["id"]: r["status"] for r in results} == {"add": "PASS", UNKNOWN: "CORRUPT"}
    (corrupt,) = [r for r in results if r["status"] == "CORRUPT"]
    assert CLAIMED in corrupt["message"]


def test_check_on_a_terminal_prints_no_hostile_sequence(project, monkeypatch):
    """With a live progress bar, rich draws escape sequences of its own; the id's colour,
    hyperlink, NUL and BEL are not among them, and its markup is not applied."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    code, out, err = invoke(project, "--suites", "none", "check", "-b", "torch_cpu_fp32", *FAST)
    assert code == 1, out + err
    for raw in ("\x1b[31mRED", "\x1b]8;;", "\x00", "\x07", "\u202e"):
        assert raw not in out + err, repr(raw)
    assert "[bold]B[/bold]" in out


def test_goldens_listing_verify_and_show(project):
    code, out, err = invoke(project, "goldens", "ls")
    assert code == 0, out + err
    no_raw(out + err)
    code, out, err = invoke(project, "goldens", "verify")
    assert code == 1, out + err
    no_raw(out + err)
    assert f"CORRUPT {UNKNOWN} seed=0: {CLAIMED}" in out
    code, out, err = invoke(project, "goldens", "show", EVIL)
    assert code == 2, out + err
    no_raw(out + err)
    assert "relu\\x1b[31mRED" in err
    code, out, err = invoke(project, "goldens", "prune")
    assert code == 0, out + err
    no_raw(out + err)


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown"])
def test_query_shows_history_text_escaped(project, fmt):
    code, out, err = invoke(project, "query", "--format", fmt,
                                "SELECT test_id, status FROM results WHERE status = 'CORRUPT'")
    assert code == 0, out + err
    no_raw(out + err)
    assert SHOWN.replace("|", "\\|") in out


def test_query_json_carries_the_exact_id(project):
    code, out, err = invoke(project, "query", "--format", "json", "SELECT test_id FROM results")
    assert code == 0, out + err
    no_raw(out)
    assert EVIL in [r["test_id"] for r in json.loads(out)]


def test_reports_show_history_text_escaped(project):
    """The support report (text and PNG: matplotlib would read `$...$` as math) and the
    HTML report, whose page holds no control character and no markup from the id."""
    code, out, err = invoke(project, "report", "support", "--png", "support.png")
    assert code == 0, out + err
    no_raw(out + err)
    assert "relu\\x1b[31mRED" in out and (project / "support.png").stat().st_size > 0
    code, out, err = invoke(project, "report", "html", "-o", "r.html")
    assert code == 0, out + err
    page = (project / "r.html").read_text(encoding="utf-8")
    assert not ACTING.findall(page.replace("\t", " "))
    assert html.escape(SHOWN) in page


def test_runs_lists_history_metadata_escaped(project):
    """A run file's meta line edited to carry the hostile text as its command and group."""
    path = next(p for p in sorted((project / "store" / "runs").glob("*.jsonl"))
                if '"command": "check"' in p.read_text().splitlines()[0])
    lines = path.read_text().splitlines()
    meta = json.loads(lines[0])
    meta["run_group"] = EVIL
    meta["env"]["torch"] = EVIL
    path.write_text("\n".join([json.dumps(meta)] + lines[1:]) + "\n")
    code, out, err = invoke(project, "runs")
    assert code == 0, out + err
    no_raw(out + err)
    assert "relu\\x1b" in out and "[bold]B" in out
    code, out, err = invoke(project, "query", "SELECT torch FROM runs")
    assert code == 0, out + err
    no_raw(out + err)


def test_pytest_failure_text_is_escaped():
    text = describe(Result(EVIL, 0, "torch_cpu_fp32", Verdict.CORRUPT, message=f"bad golden {EVIL}\nsecond line"))
    assert not ACTING.findall(text)
    assert f"CORRUPT on torch_cpu_fp32 (test '{SHOWN}' seed 0): bad golden {SHOWN}\nsecond line" in text


@pytest.mark.slow
def test_a_repro_script_keeps_the_id_in_its_docstring(tmp_path):
    """A test id may hold quotes: the repro script names it in its docstring, and nothing
    in it ends the string literal (it would run as code when the script runs)."""
    tid = 'q"""+__import__("pathlib").Path("PWNED").touch()+"""'
    project = tmp_path / "p"
    (project / "suites").mkdir(parents=True)
    (project / "suites" / "s.yaml").write_text(
        f"tests:\n  - id: '{tid}'\n    op: aten::relu\n    in: [{{type: tensor, shape: [2], dtype: float32}}]\n")
    code, out, err = invoke(project, "record", *FAST)
    assert code == 0, out + err
    code, out, err = invoke(project, "repro", tid, "-b", "torch_cpu_fp32", "-o", "r.py")
    assert code == 0, out + err
    source = (project / "r.py").read_text()
    assert ast.get_docstring(ast.parse(source)).startswith(f"Reproducer: test {tid!r} seed 0")
    proc = subprocess.run([PY, "r.py"], cwd=project, capture_output=True, text=True, env=env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (project / "PWNED").exists()
