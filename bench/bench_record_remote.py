"""`opdiff record` into s3:// (moto's server on loopback) against recording locally.

    python bench/bench_record_remote.py [--rounds 3] [-j 2] [--seeds 1] [--tree PATH ...] [--digest OUT.json]

Starts the loopback S3 server bench_remote.py starts too (benchlib.py: moto's server mode,
authentication on), then alternates, round after round: record the shipped suites into a
fresh local folder (goldens, history and cache local), then into a fresh s3:// prefix
(all three on s3://), through the real CLI in a subprocess. Each `--tree` is a checkout
whose code the CLI runs (default: this one), so an older tree can be measured in the same
rounds. Prints every wall with the 1-minute load average before it, then per tree the
median walls and remote / local. `--digest` writes, per tree, the keys of its last s3://
record with the sha256 of every object (a golden's zarr.json without the attributes that
differ from run to run: when and where it was recorded), for comparing two trees' stores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from benchlib import ROOT, S3, cli, load, run_timed

VARYING = ("created", "env")   # a golden's attributes that differ between two records of it


def digest(server: S3, bucket: str, prefix: str) -> dict[str, str]:
    """sha256 of every golden object under `prefix` (zarr.json without VARYING), by key."""
    out = {}
    for key, data in server.objects(bucket, prefix).items():
        rel = key[len(prefix):]
        if rel.endswith("zarr.json") and "/" in rel:
            meta = json.loads(data)
            for name in VARYING:
                meta.get("attributes", {}).pop(name, None)
            data = json.dumps(meta, sort_keys=True).encode()
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 of every test (default: seed 0 only)")
    ap.add_argument("--tree", action="append", type=Path, help="a checkout to run (repeatable; default: this one)")
    ap.add_argument("--test-ids", help="only these tests (a quick trial of the script)")
    ap.add_argument("--digest", type=Path, help="write keys and hashes of each tree's last s3:// store here")
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]

    work = Path(tempfile.mkdtemp(prefix="bench-record-remote-"))
    proj = work / "proj"
    shutil.copytree(ROOT / "suites", proj / "suites")
    server = S3.start(work / "moto.log")
    server.bucket("bench")
    walls: dict[tuple[str, str], list[float]] = {}
    last_prefix: dict[str, str] = {}
    fast = ["-j", str(args.jobs), "--seeds", str(args.seeds)] + (["--test-ids", args.test_ids] if args.test_ids else [])
    try:
        for r in range(args.rounds):
            for t, tree in enumerate(trees):
                env = server.env(work / f"home{t}")
                env["PYTHONPATH"] = str(tree)
                for mode in ("local", "s3"):
                    base = f"r{r}t{t}"
                    if mode == "s3":
                        where = [f"s3://bench/{base}/goldens", f"s3://bench/{base}/store", f"s3://bench/{base}/cache"]
                    else:
                        where = [str(work / base / name) for name in ("goldens", "store", "cache")]
                    before = f"{load():.2f}"
                    wall, p = run_timed(cli("--goldens", where[0], "--store", where[1], "--cache", where[2], "record",
                                            *fast, "--format", "json"), cwd=proj, env=env)
                    if p.returncode != 0:
                        raise SystemExit(f"{tree} {mode} failed ({p.returncode}):\n{p.stderr[-3000:]}")
                    counts = json.loads(p.stdout)["counts"]
                    walls.setdefault((str(tree), mode), []).append(wall)
                    if mode == "s3":
                        last_prefix[str(tree)] = f"{base}/goldens/"
                    print(f"round {r} {tree} {mode}: {wall:.1f} s, load before {before}, {counts}", flush=True)
        if args.digest:
            args.digest.write_text(json.dumps({tree: digest(server, "bench", prefix)
                                               for tree, prefix in last_prefix.items()}, indent=1, sort_keys=True))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    for tree in trees:
        local, remote = (statistics.median(walls[(str(tree), m)]) for m in ("local", "s3"))
        print(f"{tree}: local median {local:.1f} s, s3 median {remote:.1f} s, s3 / local {remote / local:.2f}x; "
              f"load now {load():.2f}")


if __name__ == "__main__":
    main()
