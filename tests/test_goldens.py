"""The golden store: round trips, keys, integrity, index/delete/overwrite, plain-zarr reading."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap

import google_crc32c
import pytest
import torch

from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.goldens import CorruptGolden, Golden, GoldenStore, MissingGolden, store_key
from opdiff_snap.suite.model import Invocation, RecordedGrads

PY = sys.executable

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALL_DTYPES = FLOATS + [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                       torch.bool, torch.complex64, torch.complex128]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random values with every bit pattern class we care about (nan, inf, -0.0, extremes)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        real = torch.randn(shape + (2,), generator=g, dtype=torch.float64)
        return torch.view_as_complex(real).to(dtype)
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dtype)
        flat = t.reshape(-1)
        for i, v in enumerate([math.nan, math.inf, -math.inf, -0.0]):
            if i < flat.numel():
                flat[i] = v
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, shape, generator=g, dtype=torch.int64)
    t = t.to(dtype)
    if t.numel() >= 2:
        t.reshape(-1)[0], t.reshape(-1)[1] = info.min, info.max
    return t


def same_bits(a, b) -> bool:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return bytes(a.contiguous().reshape(-1).view(torch.uint8).numpy()) == \
        bytes(b.contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_same(a, b) -> None:
    """Nested equality, tensors bit for bit, tuples stay tuples."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert same_bits(a, b), (a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def make_golden(test_id="aten::add.Tensor/x", seed=0, args=None, kwargs=None, states=None,
                outputs=None, **over) -> Golden:
    args = [sample(torch.float32, (3, 4)), sample(torch.float32, (4,), 1)] if args is None else args
    fields = dict(test_id=test_id, seed=seed, spec_hash="f" * 64, suite="suites/core.yaml",
                  definition={"op": "aten::add.Tensor", "inputs": [{"randn": [3, 4]}]}, test_type="op",
                  baseline={"name": "torch_cpu_fp32", "family": "torch", "device": "cpu",
                            "precision": "fp32", "options": {}},
                  env={"torch": torch.__version__, "python": "3.11"}, created="2026-01-02T03:04:05.678Z",
                  invocation=Invocation(args=args, kwargs=kwargs or {}, states=states or {}),
                  outputs=(args[0].clone(),) if outputs is None and args else outputs)
    fields.update(over)
    return Golden(**fields)


def assert_golden_equal(a: Golden, b: Golden) -> None:
    for name in ("test_id", "seed", "spec_hash", "suite", "definition", "test_type", "baseline",
                 "env", "created", "extra"):
        assert getattr(a, name) == getattr(b, name), name
    assert_same(a.invocation.args, b.invocation.args)
    assert_same(a.invocation.kwargs, b.invocation.kwargs)
    assert_same(a.invocation.states, b.invocation.states)
    assert_same(a.outputs, b.outputs)
    assert_same(None if a.grads is None else a.grads.to_nested(), None if b.grads is None else b.grads.to_nested())


@pytest.fixture
def store(tmp_path) -> GoldenStore:
    return GoldenStore(tmp_path / "goldens")


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exactly_including_0d_and_empty(store, dtype):
    tensors = [sample(dtype, (5, 7)), sample(dtype, ()), sample(dtype, (0,)), sample(dtype, (2, 0, 3)),
               sample(dtype, (1, 1, 1, 2)), sample(dtype, (4, 6)).t()]  # non-contiguous too
    golden = make_golden(args=tensors, outputs=tuple(tensors))
    store.write(golden)
    back = store.read(golden.test_id, golden.seed)
    assert_golden_equal(golden, back)
    assert back.invocation.args[1].dim() == 0
    assert back.outputs[5].shape == (6, 4)


def test_fp8_and_unsigned_wide_dtypes_round_trip(store):
    tensors = [torch.tensor([0, 1, 65535], dtype=torch.int32).to(torch.uint16),
               torch.tensor([0, 2**32 - 1], dtype=torch.int64).to(torch.uint32),
               sample(torch.float32, (8,)).to(torch.float8_e4m3fn),
               sample(torch.float32, (8,)).to(torch.float8_e5m2)]
    golden = make_golden(args=tensors, outputs=None)
    store.write(golden)
    assert_golden_equal(golden, store.read(golden.test_id, 0))


def test_nested_outputs_inputs_states_grads_and_extra(store):
    x = sample(torch.float32, (2, 3))
    args = [x, 3, 2.5, None, "mean", True, [x, (x.sum(), None)], torch.float16, math.inf, math.nan]
    kwargs = {"dim": (0, 1), "out_dtype": torch.bfloat16, "weight": sample(torch.float64, (3,))}
    states = {"a": {"linear.weight": sample(torch.float32, (3, 2)), "bn.num_batches_tracked": torch.tensor(4),
                    "bn.running_var": torch.ones(3)},
              "b": {"weight": sample(torch.bfloat16, (2,))}}
    outputs = {"a": (x, [x * 2, {"k": x.mean(), "none": None, "n": 7}], -1.5),
               "b": (x.to(torch.bfloat16), [], {})}
    grads = RecordedGrads([x.clone(), None], {"inputs": {"args[0]": x.clone()}, "params": {}})
    golden = make_golden(args=args, kwargs=kwargs, states=states, outputs=outputs, test_type="pair",
                         grads=grads, extra={"note": "intermediates later", "n": [1, 2]})
    store.write(golden)
    back = store.read(golden.test_id, 0)
    assert_golden_equal(golden, back)
    assert isinstance(back.outputs["a"], tuple) and isinstance(back.outputs["a"][1], list)
    assert back.invocation.args[7] is torch.float16
    assert list(back.invocation.states["a"]) == list(states["a"])
    assert back.invocation.states["a"]["bn.num_batches_tracked"].dim() == 0


def test_scalar_and_none_outputs_without_tensors(store):
    golden = make_golden(args=[], outputs=None)
    golden.outputs = None
    store.write(golden)
    assert store.read(golden.test_id, 0).outputs is None
    golden2 = make_golden(test_id="t2", args=[], outputs=None)
    golden2.outputs = (3, 4.5, False)
    store.write(golden2)
    assert store.read("t2", 0).outputs == (3, 4.5, False)


def test_unstorable_values_raise_and_leave_nothing(store):
    with pytest.raises(TypeError):
        store.write(make_golden(outputs=(object(),)))
    with pytest.raises(TypeError):
        store.write(make_golden(outputs=torch.zeros(3).to_sparse()))
    assert store.index() == []
    assert os.listdir(store.root / ".staging") == ["zarr.json"]


# ---------------------------------------------------------------- keys

ODD_IDS = ["a/b", "a/../../etc", "..", ".", "/abs", "Conv2d", "conv2d", "CONV2D", "ünïcødé-テスト",
           "", " spaced id ", "x" * 300, "a\\b", "-dash", "aten::add.Tensor"]


def test_odd_ids_get_distinct_safe_flat_keys_and_round_trip(store):
    keys = {store_key(i, 0) for i in ODD_IDS}
    assert len(keys) == len(ODD_IDS)
    assert len({k.lower() for k in keys}) == len(ODD_IDS)  # no case-only collisions (macOS)
    for k in keys:
        assert "/" not in k and "\\" not in k and ".." not in k and not k.startswith((".", "-"))
        assert len(k) < 100 and k.isascii()
    for i, test_id in enumerate(ODD_IDS):
        store.write(make_golden(test_id=test_id, outputs=(torch.tensor([float(i)]),)))
    assert sorted(os.listdir(store.root)) == sorted(keys | {"zarr.json", ".staging", ".trash"})
    for i, test_id in enumerate(ODD_IDS):
        back = store.read(test_id, 0)
        assert back.test_id == test_id and back.outputs[0].item() == float(i)
    assert [g.test_id for g in store.index()] == sorted(ODD_IDS)


@pytest.mark.parametrize("test_id", ["tab\there", "esc\x1b[31m", "nul\x00", "rlo\u202e"])
def test_an_id_holding_a_control_character_is_not_stored(store, test_id):
    """No suite gives a test such an id, and reading one back calls it CORRUPT."""
    with pytest.raises(OpdiffError, match="a control, bidi or line-separator character"):
        store.write(make_golden(test_id=test_id))
    assert not store.exists() or store.index() == []


def test_key_format_is_stable():
    # the key is part of the on-disk format: changing it orphans every stored golden
    assert store_key("aten::add.Tensor/x", 3) == "aten_add_tensor_x-254e4de8105f1ca9-s3"
    assert store_key("Conv2d", 0) != store_key("conv2d", 0)


# ---------------------------------------------------------------- index / info / delete / overwrite

def test_index_info_delete_and_missing(store):
    assert not store.exists() and store.index() == []
    for test_id, seed in [("b", 1), ("a", 2), ("b", 0), ("a", 0)]:
        store.write(make_golden(test_id=test_id, seed=seed))
    assert store.exists()
    assert [(i.test_id, i.seed) for i in store.index()] == [("a", 0), ("a", 2), ("b", 0), ("b", 1)]
    info = store.info("b", 1)
    assert info.spec_hash == "f" * 64 and info.baseline == "torch_cpu_fp32" and info.test_type == "op"
    assert info.env["torch"] == torch.__version__ and info.created.startswith("2026-01-02")
    assert info.key == store_key("b", 1) and info.suite == "suites/core.yaml" and not info.problem
    assert store.info("b", 7) is None
    assert store.read_definition("b", 1)["op"] == "aten::add.Tensor"
    store.delete("b", 1)
    assert store.info("b", 1) is None
    assert [(i.test_id, i.seed) for i in store.index()] == [("a", 0), ("a", 2), ("b", 0)]
    with pytest.raises(MissingGolden) as exc:
        store.read("b", 1)
    assert isinstance(exc.value, OpdiffError) and "'b' seed 1" in str(exc.value)
    with pytest.raises(MissingGolden):
        store.delete("b", 1)
    assert os.listdir(store.root / ".trash") == ["zarr.json"]


def test_overwrite_replaces_whole_golden(store):
    first = make_golden(outputs=(torch.zeros(3), torch.ones(2)), states={"a": {"w": torch.ones(4)}})
    store.write(first)
    second = make_golden(outputs=(torch.full((5,), 7.0),), spec_hash="e" * 64)
    store.write(second)
    back = store.read(second.test_id, 0)
    assert_golden_equal(second, back)
    assert back.invocation.states == {}
    gdir = store.root / store_key(second.test_id, 0)
    assert sorted(os.listdir(gdir)) == ["0", "zarr.json"]  # no leftovers of the first version
    assert os.listdir(store.root / ".trash") == os.listdir(store.root / ".staging") == ["zarr.json"]
    assert len(store.index()) == 1


# ---------------------------------------------------------------- integrity

def _gdir(store, golden):
    return store.root / store_key(golden.test_id, golden.seed)


@pytest.mark.parametrize("offset", [0, 50, -1], ids=["first-byte", "second-tensor", "crc-byte"])
def test_flipped_byte_in_chunk_is_corrupt(store, offset):
    golden = make_golden()
    store.write(golden)
    chunk = _gdir(store, golden) / "0"
    raw = bytearray(chunk.read_bytes())
    raw[offset] ^= 0x10
    chunk.write_bytes(bytes(raw))
    with pytest.raises(CorruptGolden) as exc:
        store.read(golden.test_id, 0)
    err = exc.value
    assert err.test_id == golden.test_id and err.seed == 0
    assert "crc32c" in err.reason and isinstance(err, OpdiffError)
    assert golden.test_id in str(err) and "seed 0" in str(err) and "chunk file 0" in str(err)
    [(info, problem)] = store.verify(definitions=False)
    assert info.test_id == golden.test_id and "crc32c" in problem
    assert store.verify(test_id="someone else", definitions=False) == []


def test_data_rewritten_with_a_valid_crc_is_caught_by_sha256(store):
    golden = make_golden()   # args.0: 48 bytes at 0, args.1: 16 bytes at 48, outputs.0 at 64
    store.write(golden)
    chunk = _gdir(store, golden) / "0"
    data = bytearray(chunk.read_bytes()[:-4])
    data[50] ^= 1
    chunk.write_bytes(bytes(data) + struct.pack("<I", google_crc32c.value(bytes(data))))
    with pytest.raises(CorruptGolden, match="sha256 of tensor 'args.1'") as exc:
        store.read(golden.test_id, 0)
    assert exc.value.array == "args.1"


def test_lost_chunk_of_an_all_zero_golden_is_corrupt_not_zeros(store):
    golden = make_golden(args=[torch.zeros(4)], outputs=(torch.zeros(16),))
    store.write(golden)
    (_gdir(store, golden) / "0").unlink()
    with pytest.raises(CorruptGolden, match="missing"):
        store.read(golden.test_id, 0)


def test_truncated_chunk_is_corrupt(store):
    golden = make_golden()
    store.write(golden)
    chunk = _gdir(store, golden) / "0"
    chunk.write_bytes(chunk.read_bytes()[:-6])
    with pytest.raises(CorruptGolden, match="bytes, expected"):
        store.read(golden.test_id, 0)


def test_garbled_metadata_is_corrupt_and_still_listed(store):
    golden = make_golden(test_id="Mixed/Case")
    store.write(golden)
    store.write(make_golden(test_id="fine"))
    meta = _gdir(store, golden) / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40] + b"\x00garbage")
    with pytest.raises(CorruptGolden, match="unreadable") as exc:
        store.read("Mixed/Case", 0)
    assert exc.value.array == ""
    info = store.info("Mixed/Case", 0)
    assert info.problem and info.spec_hash == ""       # record sees it as stale, re-records it
    [bad] = [i for i in store.index() if i.problem]
    assert bad.key == store_key("Mixed/Case", 0) and bad.test_id.startswith("<unknown")
    assert [(i.key, p) for i, p in store.verify(definitions=False)] == [(bad.key, bad.problem)]
    store.write(golden)                                 # re-recording repairs it
    assert store.verify(definitions=False) == []


@pytest.mark.parametrize("damage", ["delete", "not-json-object", "wrong-shape", "drop-structure",
                                    "tensor-out-of-range", "bad-dtype"])
def test_damaged_metadata_is_corrupt(store, damage):
    golden = make_golden()
    store.write(golden)
    path = _gdir(store, golden) / "zarr.json"
    meta = json.loads(path.read_text())
    attrs = meta["attributes"]
    if damage == "delete":
        path.unlink()
    elif damage == "not-json-object":
        path.write_text("[1, 2]")
    else:
        if damage == "wrong-shape":
            meta["shape"] = [meta["shape"][0] - 4]
        elif damage == "drop-structure":
            del attrs["outputs"]
        elif damage == "tensor-out-of-range":
            attrs["tensors"]["outputs.0"]["offset"] = 10_000
        else:
            attrs["tensors"]["args.0"]["torch_dtype"] = "load"
        path.write_text(json.dumps(meta))
    with pytest.raises(CorruptGolden):
        store.read(golden.test_id, 0)
    assert len(store.verify(definitions=False)) == 1


def test_golden_moved_under_another_key_is_corrupt(store):
    store.write(make_golden(test_id="x"))
    os.rename(store.root / store_key("x", 0), store.root / store_key("y", 0))
    with pytest.raises(CorruptGolden, match="holds test 'x'"):
        store.read("y", 0)
    [(info, problem)] = store.verify(definitions=False)
    assert "belongs under" in problem


def test_an_index_of_some_keys_holds_their_entries_as_the_whole_index_does(store):
    for test_id in ("a", "b", "moved", "garbled"):
        store.write(make_golden(test_id=test_id))
    os.rename(store.root / store_key("moved", 0), store.root / store_key("y", 0))
    meta = store.root / store_key("garbled", 0) / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    (store.root / "stray.txt").write_text("")
    whole = {i.key: i for i in store.index()}
    some = {store_key(t, 0) for t in ("a", "y", "garbled", "absent")} | {"stray.txt"}
    assert store.index(only=some) == [i for i in store.index() if i.key in some]
    assert {i.key for i in store.index(only=some)} == some - {store_key("absent", 0)}
    assert all(whole[i.key] == i for i in store.index(only=some))


def test_golden_rewritten_by_zarr_in_another_form_still_reads(store):
    """The fast reader knows the store's own form only; anything else goes through zarr."""
    import zarr
    from zarr.codecs import ZstdCodec

    golden = make_golden(args=[sample(torch.bfloat16, (3, 5)), sample(torch.float32, (4,))])
    store.write(golden)
    path = str(_gdir(store, golden))
    old = zarr.open_array(path, mode="r")
    data, attrs = old[...], dict(old.attrs)
    new = zarr.create_array(path, shape=data.shape, dtype=data.dtype, chunks=(7,),
                            compressors=[ZstdCodec(checksum=True)], overwrite=True,
                            config={"write_empty_chunks": True})
    new[...] = data
    new.attrs.update(attrs)
    assert_golden_equal(golden, store.read(golden.test_id, 0))
    new[0] = data[0] ^ 1               # a wrong value in a valid zarr array: sha256 still catches it
    with pytest.raises(CorruptGolden, match="sha256"):
        store.read(golden.test_id, 0)


def test_large_golden_spans_several_chunks(store, monkeypatch):
    from opdiff_snap.goldens import packed

    monkeypatch.setattr(packed, "CHUNK_BYTES", 1000)
    golden = make_golden(args=[sample(torch.float64, (300,)), sample(torch.int8, (7,))])
    store.write(golden)
    files = sorted(os.listdir(_gdir(store, golden)))
    assert files == ["0", "1", "2", "3", "4", "zarr.json"]  # 2400 + 7 + 2400 bytes, chunks of 1000
    assert_golden_equal(golden, store.read(golden.test_id, 0))
    import zarr
    raw = zarr.open_array(str(_gdir(store, golden)), mode="r")[...]
    assert raw.tobytes()[:2400] == bytes(golden.invocation.args[0].numpy().tobytes())


# ---------------------------------------------------------------- staging debris

def test_staging_debris_is_ignored_and_cleaned(store):
    store.write(make_golden(test_id="whole"))
    dead = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    debris = store.root / ".staging" / f"{store_key('half', 0)}.{dead_pid}.deadbeef"
    (debris / "args.0").mkdir(parents=True)
    (debris / "args.0" / "zarr.json").write_text("{}")
    live = store.root / ".staging" / f"{store_key('busy', 0)}.{os.getpid()}.cafecafe"
    live.mkdir()
    assert [i.test_id for i in store.index()] == ["whole"]
    assert store.info("half", 0) is None and store.verify(definitions=False) == []
    assert store.clean_debris() == 1
    assert not debris.exists() and live.exists()      # a live writer's staging is left alone


# ---------------------------------------------------------------- plain zarr, another process

PLAIN_READER = textwrap.dedent("""
    import json, sys
    import numpy as np, zarr

    root, key = sys.argv[1], sys.argv[2]
    golden = zarr.open_array(f"{root}/{key}", mode="r")
    raw = golden[...]                                         # uint8: every tensor back to back
    out = {"test_id": golden.attrs["test_id"], "arrays": {}}
    for name, t in golden.attrs["tensors"].items():
        piece = raw[t["offset"]:t["offset"] + t["nbytes"]]
        arr = piece.view(np.dtype(t["dtype"]).newbyteorder("<")).reshape(t["shape"])
        out["arrays"][name] = {"hex": arr.tobytes().hex(), "shape": list(arr.shape),
                               "torch_dtype": t["torch_dtype"]}
    assert not any(m == "torch" or m.startswith(("torch.", "opdiff_snap")) for m in sys.modules)
    print(json.dumps(out))
""")


def test_plain_zarr_reads_every_array_bit_exactly_in_another_process(store):
    tensors = [sample(d, s, i) for i, d in enumerate(ALL_DTYPES) for s in [(3, 2), (), (0, 4)]]
    states = {"a": {"w": sample(torch.bfloat16, (2, 2))}}
    golden = make_golden(test_id="Plain/Zarr ünï", args=tensors[:20], kwargs={"k": tensors[20]},
                         states=states, outputs=(tensors[21:], {"x": tensors[-1]}))
    store.write(golden)
    proc = subprocess.run([PY, "-c", PLAIN_READER, str(store.root), store_key(golden.test_id, 0)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["test_id"] == golden.test_id
    expected = {f"args.{i}": t for i, t in enumerate(tensors[:20])}
    expected["kwargs.0"] = tensors[20]
    expected["state.a.0"] = states["a"]["w"]
    expected.update({f"outputs.{i}": t for i, t in enumerate(tensors[21:] + [tensors[-1]])})
    assert set(seen["arrays"]) == set(expected)
    for name, t in expected.items():
        got = seen["arrays"][name]
        raw = b"" if t.numel() == 0 else bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())
        assert bytes.fromhex(got["hex"]) == raw, name
        assert got["shape"] == list(t.shape), name
        assert got["torch_dtype"] == str(t.dtype).removeprefix("torch."), name
