"""int8 presets on the shipped models: the two errors, measured apart, and what set the
default lowering tolerance.

For each preset, one check of the suites with the lowering tolerance off (the preset
option `steps` set far out of reach), so every result shows its raw lowering error; then,
from the history, per preset:

- the counts by verdict (QUANTIZE_FAIL and the stage failures are findings, not noise);
- the quantization error: quant_sqnr (the quantized reference against the golden, dB),
  smallest / median / largest, and the tests below 20 dB;
- the lowering error: lowering_steps per result (how many results at 0, 1, 2, ... steps),
  its largest value, and the largest lowering_bias (mean signed error, in steps);
- the results beyond the preset's default `steps`.

    python bench/bench_int8.py -j 2                          # models.yaml + the zoo, 10 presets
    python bench/bench_int8.py --suites suites/models.yaml --presets onnx_cpu_int8

Prints JSON; the history stays in --store (default a scratch folder) for queries.
`--markdown FILE` also writes, per test, each preset's verdict, quantization error (dB)
and lowering error (steps): the int8 section of docs/results.md. `--from-store` reads
the latest run of each preset in each --store (several stores: suites checked apart)
instead of checking again.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchlib import ROOT, check_once, query

PRESETS = ("executorch_cpu_int8,executorch_cpu_int8pt,executorch_cpu_int8dyn,onnx_cpu_int8,onnx_cpu_int8pt,"
           "onnx_cpu_int8dyn,inductor_cpu_int8,inductor_cpu_int8dyn,coreml_any_int8,coreml_any_int8pt")
OFF = 1e9          # the `steps` that no lowering error reaches


def check(store: Path, cache: Path, suites: list[str], preset: str, jobs: int, timeout_s: int) -> dict:
    return check_once(store, cache, suites, preset, jobs, "--timeout-s", str(timeout_s),
                      "--preset-options", f'{preset}={{"steps": {OFF}}}')


def rows_of(store: Path, run: str) -> list[dict]:
    return query(store, "SELECT test_id, status, quant_sqnr, lowering_sqnr, lowering_steps, lowering_bias, "
                        f"quant_step, error_message FROM results WHERE run_id = '{run}' ORDER BY test_id")


def _number(v) -> float | None:
    if v is None:
        return None
    return float(v) if not isinstance(v, str) else float(v.replace("Infinity", "inf"))


def summary(rows: list[dict], steps_allowed: float) -> dict:
    judged = [r for r in rows if r["lowering_steps"] is not None]
    measured = [r for r in rows if r["quant_sqnr"] is not None]   # converted but not run: still measured
    sqnr = sorted(x for x in (_number(r["quant_sqnr"]) for r in measured) if x is not None and math.isfinite(x))
    steps = [_number(r["lowering_steps"]) for r in judged]
    bias = [_number(r["lowering_bias"]) or 0.0 for r in judged]
    failures = {r["test_id"]: f"{r['status']}: {(r['error_message'] or '')[:160]}" for r in rows
                if r["status"] not in ("PASS", "MISMATCH")}
    return {
        "counts": dict(Counter(r["status"] for r in rows)),
        "quant_sqnr_db": {"min": sqnr[0] if sqnr else None, "median": statistics.median(sqnr) if sqnr else None,
                          "max": sqnr[-1] if sqnr else None, "exact": len(measured) - len(sqnr),
                          "below_20": [r["test_id"] for r in measured
                                       if (_number(r["quant_sqnr"]) or math.inf) < 20]},
        "lowering_steps": {"histogram": dict(sorted(Counter(round(s) for s in steps).items())),
                           "max": max(steps, default=None), "max_bias": max(bias, default=None)},
        # beyond the preset's default `steps` (the mean criterion also asks that the mean
        # stand out of its noise, which the history does not keep: check with the defaults)
        "beyond_default_steps": [r["test_id"] for r, s in zip(judged, steps) if s > steps_allowed + 1e-3],
        "failures": failures,
    }


def _cell(r: dict, allowed: float) -> str:
    sqnr, steps = _number(r["quant_sqnr"]), _number(r["lowering_steps"])
    if r["status"] not in ("PASS", "MISMATCH", "SQNR_LOW", "UNAVAILABLE") or sqnr is None:
        return r["status"]
    text = f"{sqnr:.1f} dB" if math.isfinite(sqnr) else "exact"
    if steps is not None:
        text += f", {steps:.3g} st" + (f" (over {allowed:g})" if steps > allowed + 1e-3 else "")
    if r["status"] == "UNAVAILABLE":
        return f"{text}, converted"
    return text if r["status"] == "PASS" else f"{r['status']}: {text}"


def markdown(rows_by_preset: dict[str, list[dict]]) -> str:
    """One row per test, one column per preset: quant_sqnr and lowering_steps where it ran
    (marked where beyond the preset's default `steps`), else the verdict; then each
    preset's failures with their first line."""
    from opdiff_snap.backends.registry import get_preset

    presets = list(rows_by_preset)
    tests = sorted({r["test_id"] for rows in rows_by_preset.values() for r in rows})
    cells = {(p, r["test_id"]): _cell(r, float(get_preset(p).options["steps"]))
             for p, rows in rows_by_preset.items() for r in rows}
    lines = ["| test | " + " | ".join(presets) + " |", "| --- |" + " --- |" * len(presets)]
    for t in tests:
        lines.append(f"| `{t}` | " + " | ".join(cells.get((p, t), "") for p in presets) + " |")
    for p, rows in rows_by_preset.items():
        bad = [r for r in rows if r["status"] not in ("PASS", "UNAVAILABLE", "MISMATCH")]
        if bad:
            lines += ["", f"{p}: " + "; ".join(f"`{r['test_id']}` {r['status']}: "
                                               f"{(r['error_message'] or '').splitlines()[0][:140]}" for r in bad)]
    return "\n".join(lines) + "\n"


def latest_run(store: Path, preset: str) -> str | None:
    sql = (f"SELECT run_id FROM results WHERE preset = '{preset}' GROUP BY run_id ORDER BY max(ts) DESC "
           "LIMIT 1")
    found = query(store, sql)
    return found[0]["run_id"] if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=PRESETS)
    ap.add_argument("--suites", action="append", help="globs under the repository root "
                    "(default: suites/models.yaml and suites/zoo)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--timeout-s", type=int, default=900)
    ap.add_argument("--store", type=Path, action="append")
    ap.add_argument("--markdown", type=Path, help="write the per-test table here")
    ap.add_argument("--from-store", action="store_true", help="report the latest runs in --store; run nothing")
    args = ap.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    if args.from_store:
        rows_by_preset = {}
        for preset in presets:
            for base in args.store or []:     # the latest run of each store: suites checked apart
                run = latest_run(base / "store", preset)
                if run is not None:
                    rows_by_preset.setdefault(preset, []).extend(rows_of(base / "store", run))
        if args.markdown:
            args.markdown.write_text(markdown(rows_by_preset))
        print(json.dumps({p: dict(Counter(r["status"] for r in rows)) for p, rows in rows_by_preset.items()}))
        return
    suites = sorted(p for g in (args.suites or ["suites/models.yaml", "suites/zoo"])
                    for p in glob.glob(g, root_dir=ROOT))
    base = args.store[0] if args.store else Path(tempfile.mkdtemp(prefix="opdiff-bench-int8-"))
    store, cache = base / "store", base / "cache"
    out: dict = {"suites": suites, "presets": {}}
    rows_by_preset = {}
    for preset in presets:
        run = check(store, cache, suites, preset, args.jobs, args.timeout_s)
        from opdiff_snap.backends.registry import get_preset

        rows_by_preset[preset] = rows = rows_of(store, run["run"])
        entry = {**run, **summary(rows, float(get_preset(preset).options["steps"]))}
        out["presets"][preset] = entry
        print(json.dumps({preset: entry}), file=sys.stderr, flush=True)
    out["store"] = str(base)
    if args.markdown:
        args.markdown.write_text(markdown(rows_by_preset))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
