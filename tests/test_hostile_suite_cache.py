"""A suite-cache entry edited by someone else is never trusted.

An entry under `<cache>/suites/` whose key still matches but whose tests were edited (relu
made to run aten::neg, a skip planted over a real EXPORT_FAIL, a `file:` module of the
editor's own named) is ignored with a warning naming it, and the suite is expanded afresh:
the check gives the verdicts of a fresh load, and nothing the edit names runs."""

from __future__ import annotations

import contextlib
import json
import textwrap
from pathlib import Path

import pytest
from helpers.check import new_project
from helpers.cli import invoke

from opdiff_snap import api
from opdiff_snap.core.config import Settings

pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning")]

SUITE = textwrap.dedent("""\
    presets:
      x: {type: tensor, shape: [2, 4], dtype: float32, init: normal}
    tests:
      - {id: relu, op: aten::relu.default, in: [{ref: x}]}
      - {id: i0, op: aten::i0.default, in: [{ref: x}]}
      - {id: scale_file, op: {type: module, path: "file:mods.py::Scale", args: [2.0]}, in: [{ref: x}]}
    """)
CHECK = ("check", "-b", "torch_cpu_fp32", "-b", "onnx_cpu_fp32", "--in-process", "-j", "1", "--repeats", "1",
         "--warmup", "0", "--format", "json")


@pytest.fixture(autouse=True)
def _own_state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def _entry(root: Path) -> Path:
    (entry,) = [p for p in (root / ".opdiff-cache" / "suites").glob("*.json") if not p.name.startswith("discover-")]
    return entry


def _split(data: bytes) -> tuple[bytes, dict]:
    """(what precedes the JSON body, the body) of an entry, whatever framing it has."""
    start = data.index(b"{")
    return data[:start], json.loads(data[start:])


def _check(root: Path) -> tuple[int, dict[tuple[str, str], str], str]:
    code, out, err = invoke(root, *CHECK)
    verdicts = {(r["id"], r["preset"]): r["status"] for r in json.loads(out)["results"]}
    return code, verdicts, err


def _retarget(test: dict, target: str) -> None:
    """The op or module path a kept test calls."""
    test["definition"]["call"]["target"] = target


def test_a_tampered_suite_cache_entry_gives_the_verdicts_of_a_fresh_load(tmp_path):
    root = new_project(tmp_path / "p")
    (root / "suites" / "s.yaml").write_text(SUITE)
    marker = tmp_path / "planted-module-ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\nimport torch\n"
                    "class Scale(torch.nn.Module):\n    def __init__(self, k):\n        super().__init__()\n"
                    "    def forward(self, x):\n        return -x\n")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0)
    with contextlib.chdir(root):
        api.record(api.RecordRequest(running=api.Running(in_process=True)), settings=settings)
    code, fresh, said = _check(root)
    assert fresh[("i0", "onnx_cpu_fp32")] == "EXPORT_FAIL" and fresh[("relu", "torch_cpu_fp32")] == "PASS", fresh
    entry = _entry(root)
    good = entry.read_bytes()
    plants = {
        "relu as aten::neg": lambda t: t["id"] == "relu" and _retarget(t, "aten::neg.default"),
        "a skip over EXPORT_FAIL": lambda t: t["id"] == "i0" and t["definition"].update(
            skip={"onnx_*": "planted"}),
        "a file: module": lambda t: t["id"] == "scale_file" and (_retarget(t, f"file:{evil}::Scale"),
                                                                 t["source_files"].append(str(evil))),
    }
    for name, edit in plants.items():
        head, value = _split(good)
        for test in value["tests"]:
            edit(test)
        entry.write_bytes(head + json.dumps(value, separators=(",", ":")).encode())
        tampered = _check(root)
        assert tampered[:2] == (code, fresh) and not marker.exists(), name
        assert "suite cache entry" in tampered[2] and entry.name in tampered[2] and "ignored" in tampered[2], name
        again = _check(root)                      # written again, and used quietly
        assert again[:2] == (code, fresh) and "suite cache" not in again[2], (name, again[2])


def test_a_signing_key_that_is_not_private_keeps_the_cache_unused(tmp_path, monkeypatch):
    from opdiff_snap.core.signing import key_path
    from opdiff_snap.suite import load_suites, suite_paths
    from opdiff_snap.suite.reader import SuiteReader

    root = new_project(tmp_path / "p")
    (root / "suites" / "s.yaml").write_text(SUITE)
    monkeypatch.chdir(root)
    key_path().parent.mkdir(parents=True)
    key_path().write_bytes(b"k" * 32)
    key_path().chmod(0o644)                      # others could read it, so could sign with it
    said: list[str] = []
    reader = SuiteReader(tmp_path / "cache", said.append)
    assert [c.id for c in load_suites(suite_paths(None, Path("suites"), reader), reader=reader)] == \
        ["relu", "i0", "scale_file"]
    assert len(said) == 1 and str(key_path()) in said[0] and "not used" in said[0], said
    assert not list((tmp_path / "cache").rglob("*.json"))
