"""The golden store under SIGKILL and under two concurrent writers (real processes)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from opdiff_snap.goldens import GoldenStore

PY = sys.executable

# argv: root, tag, first, count, barrier-file ("-" for none); ids w<i> for i in [first, first+count)
WRITER = textwrap.dedent("""
    import os, sys, time
    import torch
    from opdiff_snap.goldens import Golden, GoldenStore
    from opdiff_snap.suite.model import Invocation

    root, tag, first, count, barrier = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    if barrier != "-":
        open(barrier + "." + str(os.getpid()), "w").close()
        while not os.path.exists(barrier):
            time.sleep(0.001)
    store = GoldenStore(root)
    later = os.environ.get("WRITER_LATER") == "1"   # as record does: list the store, write from threads
    if later:
        store.units.listed()
    pending = []
    for i in range(first, first + count):
        x = torch.full((32, 32), tag)
        golden = Golden(test_id=f"w{i}", seed=0, spec_hash=str(tag), suite="s.yaml", definition={},
                        test_type="op", baseline={"name": "torch_cpu_fp32"}, env={}, created="now",
                        invocation=Invocation(args=[x, x + 1], kwargs={}, states={"a": {"w": x * 2}}),
                        outputs=(x * 3, [x * 4]))
        if later:
            pending.append(store.write_later(golden))
        else:
            store.write(golden)
    for write in pending:
        write.result()
    store.stop_writes()
""")


def _check_whole(store: GoldenStore) -> list[str]:
    """Every listed golden reads, verifies, and is internally consistent (one writer's)."""
    assert store.verify(definitions=False) == []
    ids = []
    for info in store.index():
        g = store.read(info.test_id, info.seed)
        tag = float(g.spec_hash)
        x = g.invocation.args[0]
        assert torch.equal(x, torch.full((32, 32), tag))
        assert torch.equal(g.invocation.args[1], x + 1)
        assert torch.equal(g.invocation.states["a"]["w"], x * 2)
        assert torch.equal(g.outputs[0], x * 3) and torch.equal(g.outputs[1][0], x * 4)
        ids.append(info.test_id)
    return ids


@pytest.mark.slow
def test_sigkilled_writer_leaves_only_whole_goldens_and_a_rerun_completes(tmp_path):
    root = tmp_path / "goldens"
    store = GoldenStore(root)
    rng = random.Random(1)
    for attempt in range(2):
        # 2,000 goldens: far more than get written between "10 new ones exist" and the kill,
        # even on an idle machine, so the kill always lands mid-run
        proc = subprocess.Popen([PY, "-c", WRITER, str(root), str(attempt + 1), "0", "2000", "-"],
                                stderr=subprocess.PIPE)
        before = len(store.index())
        deadline = time.monotonic() + 120
        while len(os.listdir(root)) - 3 < before + 10 if root.exists() else True:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        proc.stderr.close()
        ids = _check_whole(store)
        assert 0 < len(ids) < 2000
    # the dead writers' staging debris is ignored above, and cleaned now
    store.clean_debris()
    assert os.listdir(root / ".staging") == os.listdir(root / ".trash") == ["zarr.json"]
    missing = [i for i in range(2000) if store.info(f"w{i}", 0) is None]
    assert missing
    subprocess.run([PY, "-c", WRITER, str(root), "9", str(min(missing)), str(2000 - min(missing)), "-"],
                   check=True, timeout=300)
    assert sorted(_check_whole(store)) == sorted(f"w{i}" for i in range(2000))


@pytest.mark.slow
def test_two_concurrent_writers_into_a_new_store_lose_nothing(tmp_path):
    root = tmp_path / "new" / "goldens"
    barrier = tmp_path / "go"
    # writer 1: w0..w59, writer 2: w50..w109 (ten ids both write)
    procs = [subprocess.Popen([PY, "-c", WRITER, str(root), tag, first, "60", str(barrier)],
                              stderr=subprocess.PIPE)
             for tag, first in (("1", "0"), ("2", "50"))]
    deadline = time.monotonic() + 120
    while len([p for p in os.listdir(tmp_path) if p.startswith("go.")]) < 2:
        assert all(p.poll() is None for p in procs)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    barrier.touch()  # both create the root group at about the same moment
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    store = GoldenStore(root)
    assert sorted(_check_whole(store)) == sorted(f"w{i}" for i in range(110))
    assert os.listdir(root / ".staging") == os.listdir(root / ".trash") == ["zarr.json"]
