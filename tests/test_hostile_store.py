"""Golden stores that were tampered with, and outputs a golden cannot hold as they are.

Each case ends in a verdict of its own for what is wrong (BASELINE_FAIL at record, CORRUPT
at check and verify) while everything else in the run gets its real verdict: dict keys of
different types, nesting beyond the one limit record and check share, an id holding
terminal control characters, entries of the store that are no golden (a file, a symbolic
link, a folder without zarr.json, unreadable metadata), and a declared length or chunk
layout that does not match what is stored."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.cli import invoke
from helpers.hostile import (
    FAST,
    MODELS,
    SUITE,
    assert_clean_failure,
    copy_project,
    edit_attrs,
    golden_meta,
    make_project,
    run_cli,
    snapshot,
    tree_bytes,
)

from opdiff_snap.goldens import GoldenStore, store_key

NO_SUITES = ("--suites", "no-suites-here")   # check and verify from the goldens alone
# from the goldens alone, the file: modules of these goldens run only when the store is trusted
TRUSTED = ("--trust-goldens",)

MORE_MODELS = '''

class Keys(nn.Module):
    """Two outputs under keys that differ only in type."""

    def forward(self, x):
        return {1: x + 1, "1": x * 2}


class Colliding(nn.Module):
    """A tuple key and the string of it: one key once stored."""

    def forward(self, x):
        return {(1, 2): x + 1, "(1, 2)": x * 2}


class Nested(nn.Module):
    """x wrapped in `depth` tuples: its tensor sits `depth` levels below the root."""

    def __init__(self, depth: int):
        super().__init__()
        self.depth = depth

    def forward(self, x):
        out = x
        for _ in range(self.depth):
            out = (out,)
        return out
'''

MORE_TESTS = """\
  - id: keys
    op: {type: module, path: "file:models.py::Keys"}
    in: [{type: tensor, shape: [3], dtype: float32, init: normal}]
  - id: nested100
    op: {type: module, path: "file:models.py::Nested", args: [{type: const, value: 100}]}
    in: [{type: tensor, shape: [3], dtype: float32, init: normal}]
  - id: zeros
    op: aten::relu
    in: [{type: tensor, shape: [64], dtype: float32, init: zeros}]
"""

REFUSED_TESTS = """\
  - id: colliding
    op: {type: module, path: "file:models.py::Colliding"}
    in: [{type: tensor, shape: [3], dtype: float32, init: normal}]
  - id: nested101
    op: {type: module, path: "file:models.py::Nested", args: [{type: const, value: 101}]}
    in: [{type: tensor, shape: [3], dtype: float32, init: normal}]
"""

ALL = ("add", "relu", "scale", "big", "keys", "nested100", "zeros")


def _project(root: Path, tests: str = MORE_TESTS) -> Path:
    make_project(root)
    (root / "suites" / "s.yaml").write_text(SUITE + tests)
    (root / "suites" / "models.py").write_text(MODELS + MORE_MODELS)
    return root


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """The hostile-input project plus a dict with keys 1 and "1", an output 100 levels
    deep and a golden of zeros, recorded and checked once by the real CLI."""
    project = _project(tmp_path_factory.mktemp("goldens") / "p")
    for args in (("record", *FAST), ("check", "-b", "torch_cpu_fp32", *FAST)):
        proc = run_cli(project, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return project


@pytest.fixture
def project(recorded, tmp_path) -> Path:
    return copy_project(recorded, tmp_path / "p")


def _check(project: Path, *args: str, expect: int = 1, front: tuple[str, ...] = ()) -> dict[str, dict]:
    """`opdiff check --format json` as {test id: result} (each id once), after asserting a
    clean exit `expect`."""
    trust = TRUSTED if front == NO_SUITES else ()
    code, out, err = invoke(project, *front, "check", "-b", "torch_cpu_fp32", "--format", "json", *FAST, *trust,
                                *args)
    assert code == expect, out + err
    assert "Traceback" not in out + err and "internal error" not in out + err
    results = json.loads(out)["results"]
    by_id = {r["id"]: r for r in results}
    assert len(by_id) == len(results), [r["id"] for r in results]
    return by_id


def _verify(project: Path, *front: str) -> tuple[int, str]:
    code, out, err = invoke(project, *front, "goldens", "verify")
    assert "Traceback" not in out + err and "internal error" not in out + err
    return code, out


# ---------------------------------------------------------------- dict keys

def test_dict_keys_of_different_types_are_both_kept(project):
    golden = GoldenStore(project / "goldens").read("keys", 0)
    assert set(golden.outputs) == {1, "1"}
    x = golden.invocation.args[0]
    assert golden.outputs[1].equal(x + 1) and golden.outputs["1"].equal(x * 2)
    results = _check(project, "--test-ids", "keys", expect=0)
    assert results["keys"]["status"] == "PASS"


def test_dict_keys_that_one_stored_key_would_merge_are_refused(project):
    """A tuple key beside its own string: record refuses the test (BASELINE_FAIL naming it
    and both keys) and writes no golden, instead of keeping one of the two outputs."""
    _project(project, MORE_TESTS + REFUSED_TESTS)
    code, out, err = invoke(project, "record", "--test-ids", "colliding", "--format", "json", *FAST)
    assert_clean_failure(code, out, err, 1, "BASELINE_FAIL")
    [result] = json.loads(out)["results"]
    assert result["status"] == "BASELINE_FAIL"
    assert "the output of test 'colliding' has the keys (1, 2) and '(1, 2)'" in result["message"]
    assert not (project / "goldens" / store_key("colliding", 0)).exists()


def test_a_golden_whose_dict_holds_a_key_twice_is_corrupt(project):
    """Reading such a dict back would keep one of its values: CORRUPT, never a quiet drop."""
    edit_attrs(project, "relu", lambda a: a.update(outputs={"dict": [["k", {"tensor": 0}], ["k", {"value": 1}]]}))
    code, out = _verify(project)
    assert code == 1 and "CORRUPT relu seed=0: outputs: the key 'k' appears more than once" in out
    results = _check(project, "--test-ids", "relu")
    assert results["relu"]["status"] == "CORRUPT"
    assert "the key 'k' appears more than once" in results["relu"]["message"]


# ---------------------------------------------------------------- nesting

def test_record_refuses_what_check_could_not_read_with_the_same_limit(project):
    """100 levels deep is recorded and passes check; 101 levels is refused at record
    (BASELINE_FAIL naming the test and the limit), so no golden is ever CORRUPT for it."""
    _project(project, MORE_TESTS + REFUSED_TESTS)
    code, out, err = invoke(project, "record", "--test-ids", "nested101", "--format", "json", *FAST)
    assert_clean_failure(code, out, err, 1, "BASELINE_FAIL")
    [result] = json.loads(out)["results"]
    assert result["status"] == "BASELINE_FAIL"
    assert "the output of test 'nested101' nests deeper than 100 levels" in result["message"]
    assert not (project / "goldens" / store_key("nested101", 0)).exists()
    results = _check(project, "--test-ids", "nested100", expect=0)
    assert results["nested100"]["status"] == "PASS"
    code, out = _verify(project)
    assert code == 0 and "0 corrupt" in out


# ---------------------------------------------------------------- ids that are not ids

OSC = "\x1b]0;pwned\x07"
SHOWN = "\\x1b]0;pwned\\x07"


def _osc_id(a):
    a["test_id"] = OSC


@pytest.mark.slow
def test_an_id_holding_terminal_controls_is_corrupt_and_the_run_goes_on(project):
    """Named by the test whose folder it lies in (with the suites) or by that folder (from
    the goldens alone), the id itself shown escaped; every other test gets its verdict."""
    edit_attrs(project, "relu", _osc_id)
    before, goldens = snapshot(project), tree_bytes(project / "goldens")
    for front, name in (((), "relu"), (NO_SUITES, f"<unknown: {store_key('relu', 0)}>")):
        trust = TRUSTED if front == NO_SUITES else ()
        code, out, err = invoke(project, *front, "check", "-b", "torch_cpu_fp32", *FAST, *trust)
        assert_clean_failure(code, out, err, 1, f"its test_id '{SHOWN}' holds control characters")
        assert "\x1b" not in out + err and "\x07" not in out + err
        results = _check(project, front=front)
        assert {tid: r["status"] for tid, r in results.items()} == \
            {name: "CORRUPT", **{t: "PASS" for t in ALL if t != "relu"}}
        assert f"its test_id '{SHOWN}' holds control characters" in results[name]["message"]
    code, out = _verify(project)
    assert code == 1 and f"CORRUPT <unknown: {store_key('relu', 0)}> seed=0: its test_id '{SHOWN}' holds " \
                         "control characters" in out
    assert "\x1b" not in out
    assert snapshot(project) == before and tree_bytes(project / "goldens") == goldens


def test_a_golden_moved_under_the_key_of_its_edited_id_is_corrupt_too(project):
    """The folder renamed to match the edited id: the id itself is refused."""
    edit_attrs(project, "relu", _osc_id)
    golden_meta(project, "relu").parent.rename(project / "goldens" / store_key(OSC, 0))
    results = _check(project, front=NO_SUITES)
    assert results[f"<unknown: {store_key(OSC, 0)}>"]["status"] == "CORRUPT"
    assert sum(r["status"] == "PASS" for r in results.values()) == len(ALL) - 1


@pytest.mark.slow
def test_a_golden_whose_id_was_edited_is_corrupt_where_it_lies(project):
    """relu's golden edited to claim add's id: CORRUPT, named by its folder, and the real
    add still passes, from the goldens alone and with the suites."""
    edit_attrs(project, "relu", lambda a: a.update(test_id="add"))
    results = _check(project, front=NO_SUITES)
    stray = results[f"<unknown: {store_key('relu', 0)}>"]
    assert stray["status"] == "CORRUPT" and results["add"]["status"] == "PASS"
    assert f"it holds test 'add' seed 0, whose golden belongs under {store_key('add', 0)}" in stray["message"]
    results = _check(project)
    assert results["relu"]["status"] == "CORRUPT" and results["add"]["status"] == "PASS"


# ---------------------------------------------------------------- entries that are no golden

def _strays(project: Path, outside: Path) -> None:
    """relu replaced by a file, add by a symbolic link to a golden moved out of the store,
    scale's zarr.json not JSON, and a folder without zarr.json."""
    goldens = project / "goldens"
    relu = golden_meta(project, "relu").parent
    shutil.rmtree(relu)
    relu.write_text("not a golden\n")
    add = golden_meta(project, "add").parent
    add.rename(outside)
    add.symlink_to(outside, target_is_directory=True)
    golden_meta(project, "scale").write_text("{not json")
    (goldens / "notes").mkdir()
    (goldens / "notes" / "todo.txt").write_text("a folder that is no golden\n")


STRAY_PROBLEMS = {
    "relu": "goldens/{relu} is a file, not a golden",
    "add": "goldens/{add} is a symbolic link to {outside}, not a golden",
    "scale": "zarr.json is unreadable",
    "<unknown: notes>": "zarr.json is missing (goldens/notes/zarr.json)",
}


@pytest.mark.slow
def test_every_entry_that_is_no_golden_is_reported_by_verify_and_check(project, tmp_path):
    outside = tmp_path / "outside-add"
    _strays(project, outside)
    keys = {"relu": store_key("relu", 0), "add": store_key("add", 0), "outside": outside}
    problems = {k: v.format(**keys) for k, v in STRAY_PROBLEMS.items()}
    kept = tree_bytes(outside)
    code, out = _verify(project)
    assert code == 1 and f"{len(ALL) + 1} goldens checked, 4 corrupt" in out, out
    for problem in problems.values():
        assert problem in out, out
    results = _check(project)   # with the suites: each test named, the stray folder too
    assert {t for t, r in results.items() if r["status"] == "CORRUPT"} == set(problems)
    for tid, problem in problems.items():
        assert problem in results[tid]["message"], results[tid]
    assert "Remove it" in results["<unknown: notes>"]["message"]
    assert {t for t, r in results.items() if r["status"] == "PASS"} == set(ALL) - set(problems)
    results = _check(project, front=NO_SUITES)
    assert sum(r["status"] == "CORRUPT" for r in results.values()) == 4
    # record replaces them; the golden the link pointed to, outside the store, is untouched
    code, out, err = invoke(project, "record", *FAST)
    assert code == 0, out + err
    assert tree_bytes(outside) == kept and not (project / "goldens" / keys["add"]).is_symlink()
    code, out = _verify(project)
    assert code == 1 and "1 corrupt" in out and "CORRUPT <unknown: notes> seed=0" in out


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_in_the_store_or_in_a_golden_never_blocks(project):
    """A named pipe where a golden belongs, and one where a golden's chunk belongs: both
    CORRUPT (opening a pipe to read it would wait for a writer forever)."""
    os.mkfifo(project / "goldens" / "pipe")
    chunk = golden_meta(project, "relu").parent / "0"
    chunk.unlink()
    os.mkfifo(chunk)
    proc = run_cli(project, "check", "-b", "torch_cpu_fp32", "--format", "json", *FAST, timeout=120)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 1, "CORRUPT")
    results = {r["id"]: r for r in json.loads(proc.stdout)["results"]}
    assert "goldens/pipe is neither a file nor a folder" in results["<unknown: pipe>"]["message"]
    assert results["relu"]["status"] == "CORRUPT"
    assert "chunk file 0 is unreadable" in results["relu"]["message"]


# ---------------------------------------------------------------- declared sizes and chunks

def _declare(nbytes: int, chunk: int | None = None):
    def change(meta):
        meta["shape"] = [nbytes]
        if chunk is not None:
            meta["chunk_grid"]["configuration"]["chunk_shape"] = [chunk]
    return change


def _edit_meta(project: Path, test_id: str, change) -> None:
    path = golden_meta(project, test_id)
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize("chunk", [None, 64 * 2**20], ids=["zarr-path", "own-layout"])
def test_a_declared_length_beyond_the_tensors_is_refused_before_reading(project, chunk):
    """2**40 bytes declared: refused from the metadata, before any allocation (verify runs
    under a 1.5 GiB address-space limit, where trusting it could not even start)."""
    _edit_meta(project, "relu", _declare(2**40, chunk))
    proc = run_cli(project, "goldens", "verify", address_space=3 * 2**29)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 1,
                         "CORRUPT relu seed=0: its shape declares 1099511627776 bytes of packed data, but "
                         "its tensors take 96 bytes together")
    results = _check(project, "--test-ids", "relu")
    assert "its shape declares 1099511627776 bytes" in results["relu"]["message"]


def _rechunk(project: Path, test_id: str, chunk: int) -> Path:
    """Rewrite a golden with zarr itself in another valid form (chunks of `chunk` bytes,
    every chunk written): the form check reads through zarr."""
    import numpy as np
    import zarr

    folder = golden_meta(project, test_id).parent
    source = zarr.open_array(str(folder), mode="r")
    data, attrs = np.asarray(source[...]), dict(source.attrs)
    shutil.rmtree(folder)
    target = zarr.create_array(str(folder), shape=data.shape, chunks=(chunk,), dtype="uint8", fill_value=0,
                               attributes=attrs, config={"write_empty_chunks": True})
    target[...] = data
    return folder


def test_a_missing_chunk_is_corrupt_in_any_zarr_layout(project):
    """A golden of zeros in chunks of 64 bytes, one chunk deleted: zarr would read it as
    zeros, and the checksums would agree. Check and verify call it CORRUPT."""
    folder = _rechunk(project, "zeros", 64)
    assert _check(project, "--test-ids", "zeros", expect=0)["zeros"]["status"] == "PASS"
    (folder / "c" / "3").unlink()
    results = _check(project, "--test-ids", "zeros")
    assert results["zeros"]["status"] == "CORRUPT"
    assert "chunk file c/3 is missing" in results["zeros"]["message"]
    code, out = _verify(project)
    assert code == 1 and "CORRUPT zeros seed=0: chunk file c/3 is missing" in out


@pytest.mark.parametrize("test_id, name, shown", [
    ("big", "0", "CORRUPT big seed=0: chunk file 0 is unreadable"),
    ("relu", "zarr.json", f"CORRUPT <unknown: {store_key('relu', 0)}> seed=0: zarr.json is unreadable"),
], ids=["chunk-to-dev-zero", "metadata-to-a-copy-outside"])
def test_a_golden_is_never_read_through_a_link(project, tmp_path, test_id, name, shown):
    """A chunk linked to /dev/zero (it would never end), and a zarr.json linked to a copy
    of itself outside the store: neither link is followed (verify runs under a 1.5 GiB
    address-space limit)."""
    path = golden_meta(project, test_id).parent / name
    target = Path("/dev/zero") if name == "0" else tmp_path / "outside.json"
    if name != "0":
        shutil.copyfile(path, target)
    path.unlink()
    path.symlink_to(target)
    proc = run_cli(project, "goldens", "verify", address_space=3 * 2**29)
    assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 1, shown)
    assert "is a symbolic link, which the store never follows" in proc.stdout
    results = _check(project, "--test-ids", test_id)
    assert results[test_id]["status"] == "CORRUPT"


# ---------------------------------------------------------------- the same behind s3://

@pytest.mark.slow
def test_an_object_where_a_golden_belongs_in_a_bucket_is_reported(tmp_path):
    """On an object store: an object where relu's golden was, and a chunk of add grown
    past a chunk's size (refused from its size, never downloaded whole)."""
    import subprocess

    from helpers.cli import run
    from helpers.hostile import REPO, env
    from helpers.remote import S3Server

    server = S3Server.start(tmp_path / "moto.log")
    try:
        bucket = server.bucket("strays")
        client = server.client()
        variables = {**env(), **server.env(tmp_path)}

        def cli(*args: str) -> subprocess.CompletedProcess:
            return run(project, "--goldens", f"s3://{bucket}/goldens", *args, timeout=300, env=variables)

        project = make_project(tmp_path / "p")
        assert str(REPO) in variables["PYTHONPATH"]
        proc = cli("record", *FAST)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        relu, add = store_key("relu", 0), store_key("add", 0)
        for key in server.keys(bucket, f"goldens/{relu}/"):
            client.delete_object(Bucket=bucket, Key=key)
        client.put_object(Bucket=bucket, Key=f"goldens/{relu}", Body=b"not a golden\n")
        chunk = client.get_object(Bucket=bucket, Key=f"goldens/{add}/0")["Body"].read()
        client.put_object(Bucket=bucket, Key=f"goldens/{add}/0", Body=chunk + bytes(2**20))
        proc = cli("goldens", "verify")
        assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 1,
                             f"CORRUPT <unknown: {relu}> seed=0: s3://{bucket}/goldens/{relu} is a single object, "
                             "not a golden")
        assert f"CORRUPT add seed=0: chunk file 0 holds more than the {len(chunk)} bytes of a chunk" in proc.stdout
        proc = cli("check", "-b", "torch_cpu_fp32", "--format", "json", *FAST)
        assert_clean_failure(proc.returncode, proc.stdout, proc.stderr, 1, "CORRUPT")
        results = {r["id"]: r["status"] for r in json.loads(proc.stdout)["results"]}
        assert results == {"add": "CORRUPT", "relu": "CORRUPT", "scale": "PASS", "big": "PASS"}
    finally:
        server.stop()
