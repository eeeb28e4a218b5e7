"""Remote stores against local ones, and the shard balance, on the shipped suites.

    python bench/bench_remote.py [-b onnx_cpu_fp32] [-j 2] [--shards 4] [--out bench_remote.json]

Starts a real S3 server on loopback (moto's server mode, with authentication, as the tests
do) and runs the real CLI in subprocesses, one step at a time:

1. record the shipped suites into a local golden store, then into s3:// (wall of each);
2. a cold check on the target with goldens, history and artifact cache all on s3:// (it
   fills the shared cache and the history the shard split reads);
3. warm re-checks: remote (a fresh runner: empty local cache tier, artifacts downloaded)
   and local (local goldens, history and a local cache holding the same artifacts);
4. N shards of the same check in one run group, each on a fresh runner, one after the
   other: the slowest shard's wall against the mean; then SQL over the group against the
   unsharded warm run: the same (test, seed, preset) items, each once;
5. a history query (`opdiff query` in-process: per-preset median latency and counts):
   a local store; a remote store through the local mirror (cold: empty mirror; warm:
   synced, nothing new); and DuckDB reading the JSONL over fsspec (obstore's filesystem
   registered with DuckDB), which re-reads everything every time.

Prints a JSON summary; the 1-minute load average is recorded before every step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, S3, cli, load, package_env, run_timed

QUERY = ("SELECT preset, count(*) AS n, count(*) FILTER (status = 'PASS') AS pass, "
         "median(infer_ms) AS median_infer_ms FROM results GROUP BY preset ORDER BY preset")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", "--backend", default="onnx_cpu_fp32")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    ap.add_argument("--test-ids", help="only these tests (a quick trial of the script)")
    args = ap.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    proj = work / "proj"
    if not proj.exists():
        proj.mkdir()
        shutil.copytree(ROOT / "suites", proj / "suites")
    server = S3.start(work / "moto.log")
    server.bucket("bench")
    env = package_env(ROOT, server.env(work))
    home = Path(env["OPDIFF_CACHE_HOME"])
    out: dict = {"backend": args.backend, "jobs": args.jobs, "steps": {}}
    run_ids: dict[str, str] = {}

    def opdiff(name: str, *argv: str, remote: bool, cache: str | None = None) -> float:
        where = (["--goldens", "s3://bench/goldens", "--store", "s3://bench/store", "--cache", "s3://bench/cache"]
                 if remote else ["--goldens", str(work / "goldens"), "--store", str(work / "store"),
                                 "--cache", cache or str(work / "cache")])
        before = round(load(), 2)
        wall, p = run_timed(cli(*where, *argv, "--format", "json"), cwd=proj, env=env)
        if p.returncode not in (0, 1):
            raise SystemExit(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        report = json.loads(p.stdout)
        run_ids[name] = report["run_id"]
        out["steps"][name] = {"wall_s": round(wall, 1), "load_before": before, "counts": report["counts"],
                              "run_id": report["run_id"]}
        print(f"{name}: {wall:.1f}s load {before} {report['counts']}", flush=True)
        return wall

    fast = ["-j", str(args.jobs)] + (["--test-ids", args.test_ids] if args.test_ids else [])
    try:
        opdiff("record_local", "record", *fast, remote=False)
        opdiff("record_remote", "record", *fast, remote=True)
        opdiff("check_cold_remote", "check", "-b", args.backend, *fast, remote=True)
        shutil.rmtree(home / "artifacts", ignore_errors=True)
        opdiff("recheck_warm_remote", "check", "-b", args.backend, *fast, remote=True)
        tier = next((home / "artifacts").iterdir())      # the same artifacts, now on this disk
        opdiff("recheck_warm_local", "check", "-b", args.backend, *fast, remote=False, cache=str(tier))
        walls = []
        for k in range(1, args.shards + 1):
            shutil.rmtree(home / "artifacts", ignore_errors=True)   # each shard on a fresh runner
            walls.append(opdiff(f"shard_{k}", "check", "-b", args.backend, *fast, "--shard",
                                f"{k}/{args.shards}", "--run-group", "bench-group", remote=True))
        mean = sum(walls) / len(walls)
        out["shard_balance"] = {"walls_s": [round(w, 1) for w in walls], "mean_s": round(mean, 1),
                                "slowest_over_mean": round(max(walls) / mean, 3)}
        out["coverage"] = coverage(env, proj, run_ids["recheck_warm_remote"])
        out["query"] = query_times(env, work)
    finally:
        server.stop()
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


def coverage(env: dict, proj: Path, unsharded: str) -> dict:
    """SQL over the group against the unsharded run (run in a subprocess with the env)."""
    code = f"""
import json
from opdiff_snap import api
from opdiff_snap.core.config import Settings
t = lambda sql: api.query(sql, Settings(store="s3://bench/store")).rows
g = "SELECT test_id, seed, preset FROM results JOIN runs USING (run_id) WHERE run_group = 'bench-group'"
u = "SELECT test_id, seed, preset FROM results WHERE run_id = '{unsharded}'"
print(json.dumps({{
  "group_items": t(f"SELECT count(*) FROM ({{g}})")[0][0],
  "group_distinct": t(f"SELECT count(*) FROM (SELECT DISTINCT * FROM ({{g}}))")[0][0],
  "unsharded_items": t(f"SELECT count(*) FROM ({{u}})")[0][0],
  "only_in_group": t(f"SELECT count(*) FROM (({{g}}) EXCEPT ({{u}}))")[0][0],
  "only_in_unsharded": t(f"SELECT count(*) FROM (({{u}}) EXCEPT ({{g}}))")[0][0],
  "per_shard": t("SELECT shard, count(*) FROM results JOIN runs USING (run_id) "
                 "WHERE run_group = 'bench-group' GROUP BY shard ORDER BY shard"),
}}))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=proj, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def query_times(env: dict, work: Path) -> dict:
    code = f"""
import json, shutil, time, os
from pathlib import Path
import duckdb
from benchlib import walls
from opdiff_snap.analytics import connect
from opdiff_snap.analytics import views
from opdiff_snap.storage.runs_remote import RemoteRuns
QUERY = {QUERY!r}
out = {{}}
def timed(fn):
    best = sorted(walls(fn, 3))
    return round(best[0], 3), round(best[len(best) // 2], 3)
remote = RemoteRuns("s3://bench/store")
mirror = remote.mirror_root
def local_cold():
    local = Path({str(work)!r}) / "qlocal"
    shutil.rmtree(local, ignore_errors=True); shutil.copytree(mirror / "runs", local / "runs")
    with connect(local, warn=False) as a: a.query(QUERY)
def local_warm():
    with connect(Path({str(work)!r}) / "qlocal", warn=False) as a: a.query(QUERY)
def mirror_cold():
    shutil.rmtree(mirror, ignore_errors=True)
    with connect("s3://bench/store", warn=False) as a: a.query(QUERY)
def mirror_warm():
    with connect("s3://bench/store", warn=False) as a: a.query(QUERY)
def fsspec_read():
    from obstore.fsspec import FsspecStore
    os.environ["AWS_ALLOW_HTTP"] = "true"   # the loopback server speaks http
    fs = FsspecStore("s3")
    con = duckdb.connect()
    con.register_filesystem(fs)
    files = {{"s3://" + p: (0, 0) for p in fs.glob("bench/store/runs/*.jsonl")}}
    views._update(con, files)
    con.execute(QUERY).fetchall()
    con.close()
mirror_cold()
n_files = len(list((mirror / "runs").glob("*.jsonl")))
size = sum(p.stat().st_size for p in (mirror / "runs").glob("*.jsonl"))
out["history"] = {{"files": n_files, "bytes": size}}
out["local_cold_s"] = timed(local_cold)
out["local_warm_s"] = timed(local_warm)
out["mirror_cold_s"] = timed(mirror_cold)
out["mirror_warm_s"] = timed(mirror_warm)
out["duckdb_fsspec_s"] = timed(fsspec_read)
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", code], env=package_env(ROOT / "bench", env), capture_output=True,
                       text=True)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
