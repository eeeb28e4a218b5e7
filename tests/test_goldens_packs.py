"""Packs (goldens/packs.py) and `opdiff goldens pack` (goldens/repack.py): small goldens
folded many to a compressed Zarr array, read back exactly; the loose layout still read;
the migration idempotent and safe to interrupt; a damaged pack a clear CORRUPT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from test_goldens import assert_golden_equal, make_golden, sample

from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.goldens import CorruptGolden, GoldenStore, MissingGolden, store_key
from opdiff_snap.goldens.packs import PACK_MAX_GOLDEN
from opdiff_snap.goldens.repack import repack


def goldens(n: int = 6) -> list:
    out = [make_golden(test_id=f"op{i}/x", seed=i % 2, suite=f"suites/s{i % 2}.yaml",
                       args=[sample(torch.float32, (3, i + 1), i), sample(torch.bfloat16, (2,), i)])
           for i in range(n)]
    out.append(make_golden(test_id="int/y", suite="suites/s0.yaml",
                           args=[sample(torch.int64, (5,)), sample(torch.bool, (4,))]))
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a store (bookkeeping folders aside), by path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.relative_to(root).parts[0].startswith(".")}


def units(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.fixture
def packed(tmp_path):
    store = GoldenStore(tmp_path / "goldens")
    written = goldens()
    for g in written:
        store.write(g)
    report = repack(store)
    return store, written, report


def test_packed_goldens_read_back_exactly_and_leave_no_loose_folder(packed):
    store, written, report = packed
    assert report.folded == report.packed == len(written) and len(report.written) == 2
    assert all(name.startswith("pack.suites_s") for name in units(store.root))
    fresh = GoldenStore(store.root)
    assert sorted(i.key for i in fresh.index()) == sorted(store_key(g.test_id, g.seed) for g in written)
    for g in written:
        assert_golden_equal(fresh.read(g.test_id, g.seed), g)
        assert fresh.info(g.test_id, g.seed).spec_hash == g.spec_hash
    assert fresh.verify(definitions=False) == []


def test_plain_zarr_reads_a_pack(packed):
    store, written, _ = packed
    root = zarr.open_group(store.root, mode="r")
    seen = {}
    for name, pack in root.arrays():
        a = pack.attrs
        assert a["opdiff_snap_pack"] == 1, name
        raw = np.asarray(pack[...]).tobytes()            # zarr checks crc32c and inflates gzip
        for offset, n_attrs, n_data in a["goldens"].values():
            attrs = json.loads(raw[offset:offset + n_attrs])
            data = raw[offset + n_attrs:offset + n_attrs + n_data]
            t = attrs["tensors"]["args.0"]
            seen[attrs["test_id"]] = np.frombuffer(data[t["offset"]:t["offset"] + t["nbytes"]],
                                                   dtype=t["dtype"]).reshape(t["shape"])
    assert sorted(seen) == sorted(g.test_id for g in written)
    g = written[0]
    assert np.array_equal(seen[g.test_id], g.invocation.args[0].numpy(), equal_nan=True)


def test_a_golden_recorded_after_packing_is_loose_and_wins_until_packed_again(packed):
    store, written, _ = packed
    newer = make_golden(test_id=written[0].test_id, seed=written[0].seed, suite="suites/s0.yaml",
                        args=[torch.ones(2, 2)], created="2027-01-01T00:00:00.000Z")
    store.write(newer)
    key = store_key(newer.test_id, newer.seed)
    assert key in units(store.root)
    assert_golden_equal(GoldenStore(store.root).read(newer.test_id, newer.seed), newer)
    assert [i.key for i in store.index()].count(key) == 1
    report = repack(GoldenStore(store.root))
    assert report.folded == 1 and len(report.written) == 1 and len(report.removed) == 1
    assert key not in units(store.root)
    assert_golden_equal(GoldenStore(store.root).read(newer.test_id, newer.seed), newer)


def test_packing_again_changes_nothing(packed):
    store, _, _ = packed
    before = snapshot(store.root)
    report = repack(GoldenStore(store.root))
    assert (report.folded, report.written, report.removed) == (0, [], [])
    assert snapshot(store.root) == before


@pytest.mark.parametrize("at", ["publish", "remove"])
def test_an_interrupted_pack_loses_nothing_and_finishes_when_run_again(packed, at):
    store, written, _ = packed
    changed = [make_golden(test_id=g.test_id, seed=g.seed, suite=g.suite, args=[torch.full((3,), 7.0)])
               for g in written[:2]] + [make_golden(test_id="new/z", suite="suites/s1.yaml")]
    interrupted = GoldenStore(store.root)
    for g in changed:
        interrupted.write(g)
    expected = {(g.test_id, g.seed): g for g in written + changed}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    setattr(interrupted.place, at, killed)
    with pytest.raises(KeyboardInterrupt):
        repack(interrupted)
    for (tid, seed), g in expected.items():
        assert_golden_equal(GoldenStore(store.root).read(tid, seed), g)
    report = repack(GoldenStore(store.root))
    assert report.packed == len(expected) and [u for u in units(store.root) if not u.startswith("pack.")] == []
    fresh = GoldenStore(store.root)
    assert len(fresh.index()) == len(expected) and fresh.verify(definitions=False) == []
    for (tid, seed), g in expected.items():
        assert_golden_equal(fresh.read(tid, seed), g)
    assert repack(fresh).written == []


def test_large_and_damaged_goldens_stay_loose(tmp_path):
    store = GoldenStore(tmp_path / "goldens")
    big = make_golden(test_id="big", args=[torch.zeros(PACK_MAX_GOLDEN // 4 + 1)])
    bad = make_golden(test_id="bad")
    for g in (big, bad, make_golden(test_id="ok")):
        store.write(g)
    chunk = store.root / store_key("bad", 0) / "0"
    chunk.write_bytes(bytes([chunk.read_bytes()[0] ^ 0xFF]) + chunk.read_bytes()[1:])
    report = repack(store)
    assert (report.packed, report.large, [k for k, _ in report.damaged]) == (1, 1, [store_key("bad", 0)])
    assert store_key("big", 0) in units(store.root) and store_key("bad", 0) in units(store.root)
    assert_golden_equal(GoldenStore(store.root).read("big", 0), big)


def test_a_packed_golden_is_deleted_from_its_pack(packed):
    store, written, _ = packed
    gone, kept = written[0], written[2]       # the same pack
    store.delete(gone.test_id, gone.seed)
    fresh = GoldenStore(store.root)
    with pytest.raises(MissingGolden):
        fresh.read(gone.test_id, gone.seed)
    assert_golden_equal(fresh.read(kept.test_id, kept.seed), kept)
    assert len(fresh.index()) == len(written) - 1


def _pack_dir(store: GoldenStore) -> Path:
    return store.root / units(store.root)[0]


def test_a_flipped_byte_in_a_pack_is_corrupt_naming_the_pack(packed):
    store, written, _ = packed
    chunk = _pack_dir(store) / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    chunk.write_bytes(bytes(raw))
    fresh = GoldenStore(store.root)
    in_pack = [g for g in written if store_key(g.test_id, g.seed) in
               json.loads((_pack_dir(store) / "zarr.json").read_text())["attributes"]["goldens"]]
    with pytest.raises(CorruptGolden) as exc:
        fresh.read(in_pack[0].test_id, in_pack[0].seed)
    assert "crc32c" in exc.value.reason and _pack_dir(store).name in str(exc.value)
    assert len(fresh.verify(definitions=False)) == len(in_pack)
    with pytest.raises(OpdiffError, match="damaged pack"):
        repack(fresh)


def test_a_garbled_pack_index_is_listed_as_corrupt_and_stops_packing(packed):
    store, written, _ = packed
    meta = _pack_dir(store) / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:50])
    fresh = GoldenStore(store.root)
    [(info, problem)] = [(i, p) for i, p in fresh.verify(definitions=False)]
    assert info.key == _pack_dir(store).name and "unreadable" in problem
    before = snapshot(store.root)
    p = subprocess.run([sys.executable, "-m", "opdiff_snap.cli", "--goldens", str(store.root), "goldens", "pack"],
                       capture_output=True, text=True, env={**os.environ})
    assert p.returncode == 2 and _pack_dir(store).name in p.stderr + p.stdout and "Traceback" not in p.stderr
    assert snapshot(store.root) == before


def test_the_pack_command_folds_a_store_and_says_what_it_did(tmp_path):
    store = GoldenStore(tmp_path / "goldens")
    for g in goldens(3):
        store.write(g)
    cmd = [sys.executable, "-m", "opdiff_snap.cli", "--goldens", str(store.root), "goldens", "pack"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "4 goldens in packs: 4 loose goldens folded in, 2 packs written" in p.stdout
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0 and "0 loose goldens folded in, 0 packs written" in again.stdout


def test_packing_a_store_behind_s3_reads_the_same_goldens(tmp_path, monkeypatch):
    from helpers.remote import S3Server

    server = S3Server.start(tmp_path / "moto.log")
    try:
        for k, v in server.env(tmp_path).items():
            if k.startswith("AWS_") or k == "OPDIFF_CACHE_HOME":
                monkeypatch.setenv(k, v)
        url = f"s3://{server.bucket('packs')}/goldens"
        store = GoldenStore(url)
        written = goldens(4)
        for g in written:
            store.write(g)
        report = repack(GoldenStore(url))
        assert report.folded == len(written) and len(report.written) == 2
        assert {k.split("/")[1] for k in server.keys("packs", "goldens/")} - {"zarr.json"} == \
            set(report.written)
        fresh = GoldenStore(url)
        for g in written:
            assert_golden_equal(fresh.read(g.test_id, g.seed), g)
        assert fresh.verify(definitions=False) == [] and repack(GoldenStore(url)).written == []
    finally:
        server.stop()
