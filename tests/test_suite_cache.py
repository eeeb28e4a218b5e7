"""Suites read once per command, and expanded suites kept in the artifact cache's folder:
a load through the cache gives exactly what a fresh load gives, and anything a suite was
made from that changes (the suite, an include, a `file:` module, where a module is found)
makes it expand afresh."""

from __future__ import annotations

import contextlib
import json
import os
import textwrap
from pathlib import Path

import pytest
from helpers.check import new_project
from test_suite_errors import CASES

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import SuiteError
from opdiff_snap.core.signing import signed, user_key
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite import load_suites, suite_paths
from opdiff_snap.suite import reader as reader_module
from opdiff_snap.suite.reader import SuiteReader

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("id", "suite", "call", "inputs", "kwargs", "pair", "device", "impl", "out", "cast_input0_to_complex",
          "tolerance", "seeds", "tags", "skip", "grad", "spec_hash", "source_files", "import_dirs")


class Counted:
    """Counts the reads (whole, or to hash them) of YAML files by absolute path, and the parses."""

    def __init__(self, monkeypatch):
        self.reads: list[str] = []
        self.parses = 0
        read, digest, parse = reader_module.read_yaml_bytes, reader_module._file_digest, reader_module.load_yaml_text

        def counted_read(path):
            if str(path).endswith((".yaml", ".yml")):
                self.reads.append(os.path.abspath(path))
            return read(path)

        def counted_digest(path):
            if str(path).endswith((".yaml", ".yml")):
                self.reads.append(os.path.abspath(path))
            return digest(path)

        def counted_parse(text):
            self.parses += 1
            return parse(text)
        monkeypatch.setattr(reader_module, "read_yaml_bytes", counted_read)
        monkeypatch.setattr(reader_module, "_file_digest", counted_digest)
        monkeypatch.setattr(reader_module, "load_yaml_text", counted_parse)


def _body(entry: bytes):
    """The value a signed entry holds (core/signing.py: signature, newline, JSON)."""
    return json.loads(entry.split(b"\n", 1)[1])


def load(folder: Path | None):
    """Every suite under ./suites, as a command reads them (through the cache in `folder`)."""
    reader = SuiteReader(folder)
    return load_suites(suite_paths(None, Path("suites"), reader), reader=reader)


def assert_same(cached, fresh) -> None:
    assert [c.id for c in cached] == [c.id for c in fresh]
    assert [c.spec_hash for c in cached] == [c.spec_hash for c in fresh]
    for a, b in zip(cached, fresh):
        assert json.dumps(a.definition, sort_keys=True) == json.dumps(b.definition, sort_keys=True), a.id
        for name in FIELDS:
            assert getattr(a, name) == getattr(b, name), (a.id, name)


def test_shipped_suites_through_the_cache_equal_a_fresh_load(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    fresh = load(None)
    assert len(fresh) > 1000
    counted = Counted(monkeypatch)
    assert_same(load(tmp_path), fresh)          # expanded, and kept
    files = len(set(counted.reads))
    assert len(counted.reads) == files and counted.parses == files   # each file read and parsed once
    counted.reads.clear()
    counted.parses = 0
    again = load(tmp_path)                      # from the cache: nothing parsed
    assert_same(again, fresh)
    assert counted.parses == 0 and len(counted.reads) == len(set(counted.reads)) == files
    assert_same(load(tmp_path), fresh)
    assert sorted(p.name for p in (tmp_path / "suites").glob("discover-*.json"))


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    tmp_path.mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


MODULE = "import torch\nclass Scale(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
X = "{type: tensor, shape: [2], dtype: float32}"


def test_a_changed_include_or_file_module_expands_afresh(tmp_path, monkeypatch):
    root = project(tmp_path / "p", {
        "suites/main.yaml": f"include: common.yaml\ntests:\n  - {{id: m, op: {{type: module, path: "
                            f"'file:mods.py::Scale'}}, in: [{X}]}}\n",
        "suites/common.yaml": f"tests:\n  - {{id: c, op: aten::neg.default, in: [{X}]}}\n",
        "suites/mods.py": MODULE})
    monkeypatch.chdir(root)
    cache = tmp_path / "cache"
    first = load(cache)
    assert_same(load(cache), first)
    (root / "suites/mods.py").write_text(MODULE.replace("x * 2", "x * 3"))
    edited = load(cache)
    assert edited[1].spec_hash != first[1].spec_hash
    assert_same(edited, load(None))
    (root / "suites/common.yaml").write_text(f"tests:\n  - {{id: c2, op: aten::neg.default, in: [{X}]}}\n")
    assert [c.id for c in load(cache)] == ["c2", "m"]
    # the same path now names two different files (a copy at the project root): ambiguous again
    (root / "mods.py").write_text(MODULE)
    for folder in (None, cache):
        with pytest.raises(SuiteError, match="ambiguous"):
            load(folder)


@pytest.mark.parametrize("name,files,field,needles", CASES, ids=[c[0] for c in CASES])
def test_malformed_suites_report_exactly_what_a_fresh_load_does(tmp_path, monkeypatch, name, files, field, needles):
    good = f"tests:\n  - {{id: good_one, op: aten::neg.default, in: [{X}]}}\n  - {{id: t1, op: aten::abs.default, " \
           f"in: [{X}]}}\n"
    root = project(tmp_path / "p", {"good.yaml": good, **files})
    monkeypatch.chdir(root)
    cache = tmp_path / "cache"
    paths = [Path("good.yaml"), Path("s.yaml")]
    assert [c.id for c in load_suites(paths[:1], reader=SuiteReader(cache))] == ["good_one", "t1"]   # kept
    with pytest.raises(SuiteError) as fresh:
        load_suites(paths)
    for _ in range(2):   # a suite with problems is never kept
        with pytest.raises(SuiteError) as cached:
            load_suites(paths, reader=SuiteReader(cache))
        assert cached.value.problems == fresh.value.problems
        assert str(cached.value) == str(fresh.value)


def test_a_cache_entry_of_another_shape_is_ignored_and_written_again(tmp_path, monkeypatch):
    root = project(tmp_path / "p", {"suites/s.yaml": f"tests:\n  - {{id: a, op: aten::neg.default, in: [{X}]}}\n"})
    monkeypatch.chdir(root)
    cache = tmp_path / "cache"
    fresh = load(None)
    load(cache)
    (entry,) = [p for p in (cache / "suites").glob("*.json") if not p.name.startswith("discover-")]
    kept = entry.read_bytes()
    good = _body(kept)
    bad_test = dict(good["tests"][0], index="0")
    for broken in ("{not json", [], {**good, "tests": "a"}, {**good, "tests": [bad_test]},
                   {**good, "depends": [["read"]]}, {**good, "key": {}}):
        for name in [entry, *(cache / "suites").glob("discover-*.json")]:
            if isinstance(broken, str):
                name.write_text(broken)
            else:   # signed as this user's opdiff-snap signs: only its shape is wrong
                name.write_bytes(signed(user_key(), json.dumps(broken).encode()))
        if isinstance(broken, str):
            with pytest.warns(RuntimeWarning, match="does not carry your opdiff-snap's signature"):
                assert_same(load(cache), fresh)
        else:
            assert_same(load(cache), fresh)
        assert entry.read_bytes() == kept


def test_check_sees_a_file_module_changed_after_a_cached_load(tmp_path, monkeypatch):
    root = new_project(tmp_path / "edge", "edge.yaml")
    settings = Settings(suites=Path("suites"), jobs=1, repeats=1, warmup=0)
    with contextlib.chdir(root):
        api.record(api.RecordRequest(selection=api.Selection(test_ids=["scale_file", "skip_onnx"]),
                                     running=api.Running(in_process=True)), settings=settings)

        def check():
            report = api.check(api.CheckRequest(backends=["torch_cpu_fp32"],
                                                selection=api.Selection(test_ids=["scale_file", "skip_onnx"]),
                                                running=api.Running(in_process=True)), settings=settings)
            return {r.test_id: r for r in report.results}

        assert {t: r.verdict for t, r in check().items()} == {"scale_file": Verdict.PASS,
                                                              "skip_onnx": Verdict.PASS}
        assert list(Path(".opdiff-cache/suites").glob("*.json"))      # kept by the first check
        counted = Counted(monkeypatch)
        assert check()["scale_file"].verdict is Verdict.PASS
        assert counted.parses == 0                                       # from the cache
        mods = Path("suites/mods.py")
        mods.write_text(mods.read_text().replace("x * self.k", "x * self.k + 0"))
        res = check()
    assert res["scale_file"].verdict is Verdict.STALE and "re-record" in res["scale_file"].message
    assert res["skip_onnx"].verdict is Verdict.PASS


def test_no_cache_keeps_nothing(tmp_path, monkeypatch):
    root = project(tmp_path / "p", {"suites/s.yaml": f"tests:\n  - {{id: a, op: aten::neg.default, in: [{X}]}}\n"})
    monkeypatch.chdir(root)
    counted = Counted(monkeypatch)
    assert [c.id for c in load(None)] == ["a"]
    assert counted.reads == [str(root / "suites" / "s.yaml")] and counted.parses == 1   # discovery's parse reused
    assert not (root / ".opdiff-cache").exists()


def test_an_entry_naming_a_dotted_package_imports_nothing(tmp_path, monkeypatch):
    """An entry is data: a `spec` observation it holds is looked up without importing."""
    root = project(tmp_path / "p", {"suites/s.yaml": f"tests:\n  - {{id: a, op: aten::neg.default, in: [{X}]}}\n"})
    monkeypatch.chdir(root)
    marker = tmp_path / "imported"
    pkg = tmp_path / "site" / "tamper_probe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cache = tmp_path / "cache"
    fresh = load(None)
    load(cache)
    (entry,) = [p for p in (cache / "suites").glob("*.json") if not p.name.startswith("discover-")]
    good = _body(entry.read_bytes())
    planted = {**good, "depends": [*good["depends"], ["spec", "tamper_probe.sub", None]]}
    entry.write_bytes(signed(user_key(), json.dumps(planted).encode()))   # even one signed with the key
    assert_same(load(cache), fresh)
    assert not marker.exists()
