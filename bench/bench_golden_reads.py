"""Read every golden of a store, timed; with --against, compare each golden with the same
golden in another store (attributes and every tensor, bit for bit).

    python bench/bench_golden_reads.py [--goldens goldens] [--against OLD_STORE]

Prints the time to list the store (index) and to read every golden in it (read: metadata,
checksums, sha256 and tensors), and with --against how many goldens differ (exit 1 if any
does, or if the two stores hold different keys). Used to check `opdiff goldens pack`.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from opdiff_snap.goldens import GoldenStore
from opdiff_snap.goldens.encode import encode


def tensors_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        x.dtype == y.dtype and x.shape == y.shape
        and raw(x) == raw(y) for x, y in ((a[k], b[k]) for k in a))


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy()) if t.numel() else b""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goldens", default="goldens")
    ap.add_argument("--against", default=None)
    args = ap.parse_args()
    store = GoldenStore(args.goldens)
    t0 = time.perf_counter()
    infos = store.index()
    t1 = time.perf_counter()
    goldens = {i.key: store.read(i.test_id, i.seed) for i in infos if not i.problem}
    t2 = time.perf_counter()
    print(f"{args.goldens}: {len(infos)} goldens ({len(infos) - len(goldens)} unreadable); "
          f"index {t1 - t0:.2f} s, read all {t2 - t1:.2f} s")
    if not args.against:
        return 0
    other = GoldenStore(args.against)
    theirs = {i.key: i for i in other.index()}
    differ = sorted(set(theirs) ^ set(goldens))
    for key, golden in goldens.items():
        if key not in theirs:
            continue
        old = other.read(theirs[key].test_id, theirs[key].seed)
        (attrs_a, named_a), (attrs_b, named_b) = encode(golden), encode(old)
        raw_a = store._metadata(key)["attributes"]
        raw_b = other._metadata(key)["attributes"]
        if raw_a != raw_b or attrs_a != attrs_b or not tensors_equal(dict(named_a), dict(named_b)):
            differ.append(key)
    print(f"against {args.against}: {len(goldens)} compared (attributes as stored and as read, every tensor "
          f"bit for bit), {len(differ)} differ or are in one store only")
    for key in differ[:20]:
        print("  DIFFERS", key)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
