"""Benchmark the history analytics on a synthetic history (default 1,000 runs x 1,000 results).

    python bench/bench_analytics.py [--runs 1000] [--results 1000] [--dir /tmp/x] [--keep]

Reports: generation time (separately), cache build time, the per-preset latency trend
with the cache (goal <= 0.5 s), a two-run diff (goal <= 0.1 s), and the same trend
query straight off the JSONL files without the cache.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
from pathlib import Path

from benchlib import timed

from opdiff_snap.analytics import connect
from opdiff_snap.analytics.ingest import LIBS
from opdiff_snap.analytics.reports import diff_runs, latency_trend

PRESETS = ["torch_cpu_fp32", "onnx_cpu_fp32", "executorch_cpu_fp32", "coreml_any_fp16"]
STATUSES = ["PASS"] * 18 + ["MISMATCH", "EXPORT_FAIL"]

# one item line, shaped like the documented format, with %-placeholders filled per line
ITEM = ('{"type": "item", "run_id": "%(run)s", "id": "%(test)s", "seed": 0, "test_type": "op", '
        '"suite": "suites/core.yaml", "spec_hash": "%(test)s-h", "tags": ["binary"], '
        '"preset": "%(preset)s", "status": "%(status)s", "export_ms": 812.3, "load_ms": 9.1, '
        '"infer_ms": %(ms).4f, "infer_ms_all": [%(ms).4f, %(ms2).4f, %(ms3).4f], '
        '"cache_hit": false, "error_class": null, "error_message": null, '
        '"tolerance": {"atol": 1e-05, "rtol": 1.3e-06}, "metrics": {"max_abs": %(ma).3g, '
        '"mean_abs": 0.0, "mse": 0.0, "max_rel": 0.0, "cosine": 1.0, "mismatched": 0, '
        '"mismatched_frac": 0.0, "numel": 12, "worst_index": [0, 3], "worst_output": "0", '
        '"worst_expected": 1.25, "worst_actual": 1.25, "min_atol": 0.0}, '
        '"baseline": "torch_cpu_fp32", "backends": [{"name": "%(preset)s", "res": {"status": '
        '"%(status)s", "infer_ms": %(ms).4f}}], "times_all": {"%(preset)s": {"infer_ms": %(ms).4f}}, '
        '"diff_all": {"%(preset)s": {"max_abs": %(ma).3g}}, "ts": "%(ts)s"}\n')


def generate(store: Path, runs: int, results: int, seed: int = 0) -> None:
    rnd = random.Random(seed)
    (store / "runs").mkdir(parents=True, exist_ok=True)
    base_ms = [rnd.uniform(0.01, 5.0) for _ in range(results)]
    for r in range(runs):
        day, sec = divmod(r, 86400)
        clock = f"{sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
        ts = f"2026-{1 + (day // 28) % 12:02d}-{1 + day % 28:02d}T{clock}Z"
        run = f"2026R{r:05d}-{r:06x}"
        ort = "1.30.0" if r < runs // 2 else "1.31.1"
        meta = {"type": "meta", "run_id": run, "command": "check", "argv": ["opdiff", "check"],
                "started": ts, "host": "box", "os": "Linux", "machine": "x86_64",
                "suites": ["suites/core.yaml"], "baseline_preset": "torch_cpu_fp32",
                "presets": {p: {"family": p.split("_")[0]} for p in PRESETS},
                "env": {**{k: "1.0" for k in LIBS}, "onnxruntime": ort}}
        lines = [json.dumps(meta) + "\n"]
        for i in range(results):
            ms = base_ms[i] * rnd.uniform(0.9, 1.1)
            lines.append(ITEM % {"run": run, "test": f"op{i // 4}__c{i}", "preset": PRESETS[i % 4],
                                 "status": STATUSES[rnd.randrange(20)], "ms": ms, "ms2": ms * 1.02,
                                 "ms3": ms * 0.98, "ma": rnd.random() * 1e-5, "ts": ts})
        lines.append(json.dumps({"type": "end", "run_id": run, "finished": ts, "wall_s": 1.0,
                                 "counts": {}}) + "\n")
        (store / "runs" / f"{run}.jsonl").write_text("".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--results", type=int, default=1000)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    store = args.dir or Path(tempfile.mkdtemp(prefix="opdiff-bench-"))
    try:
        _, t_gen = timed(lambda: generate(store, args.runs, args.results))
        size = sum(p.stat().st_size for p in (store / "runs").glob("*.jsonl"))
        print(f"history: {args.runs} runs x {args.results} results, {size / 1e6:.0f} MB, "
              f"generated in {t_gen:.1f} s")
        a, t_build = timed(lambda: connect(store))
        print(f"cache build (first connect):      {t_build:7.2f} s")
        a.close()
        a, t_open = timed(lambda: connect(store))
        print(f"connect, cache up to date:        {t_open:7.3f} s")
        trend, t_trend = timed(lambda: latency_trend(a))
        print(f"latency trend with cache:         {t_trend:7.3f} s  ({len(trend)} rows; goal <= 0.5 s)")
        ids = [r[0] for r in a.sql("SELECT run_id FROM runs ORDER BY started").rows]
        d, t_diff = timed(lambda: diff_runs(a, ids[-2], ids[-1]))
        print(f"two-run diff with cache:          {t_diff:7.3f} s  ({d.summary()[:60]}...; goal <= 0.1 s)")
        d, t_by = timed(lambda: diff_runs(a, by="onnxruntime"))
        print(f"diff --by onnxruntime with cache: {t_by:7.3f} s")
        a.close()
        import duckdb
        con = duckdb.connect()
        glob = str(store / "runs" / "*.jsonl")
        sql = f"""SELECT m.run_id, m.started, i.preset, count(*), median(i.infer_ms)
                  FROM read_json('{glob}', format='newline_delimited', ignore_errors=true,
                       columns={{'type': 'VARCHAR', 'run_id': 'VARCHAR', 'started': 'VARCHAR',
                                 'preset': 'VARCHAR', 'infer_ms': 'DOUBLE'}}) i
                  JOIN (SELECT run_id, started FROM read_json('{glob}', format='newline_delimited',
                        ignore_errors=true, columns={{'type': 'VARCHAR', 'run_id': 'VARCHAR',
                        'started': 'VARCHAR'}}) WHERE type = 'meta') m USING (run_id)
                  WHERE i.type = 'item' AND i.infer_ms > 0 GROUP BY ALL ORDER BY 2, 1, 3"""
        rows, t_raw = timed(lambda: con.execute(sql).fetchall())
        print(f"latency trend off JSONL, no cache: {t_raw:6.2f} s  ({len(rows)} rows)")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
