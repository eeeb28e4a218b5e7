"""Generate docs/results.md: the shipped suites on every preset that runs here, from real
runs, with every non-PASS explained by a rule in docs/results-notes.yaml.

    python tools/results_page.py --run            # check every preset into store/, then write
    python tools/results_page.py                  # write from the history already in store/
    python tools/results_page.py --before OLD.md  # also: tolerance-choice MISMATCHes then and now

A non-PASS that no rule explains is listed as UNEXPLAINED and the script exits 1, so the
page can never silently carry an unexplained failure.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opdiff_snap.analytics import connect  # noqa: E402
from opdiff_snap.cli.output import headline  # noqa: E402
from opdiff_snap.core.verdicts import Verdict  # noqa: E402

PRESETS = ["torch_cpu_fp32", "torch_cpu_fp16", "torch_cpu_bf16", "inductor_cpu_fp32", "onnx_cpu_fp32", "onnx_cpu_fp16",
           "executorch_cpu_fp32", "executorch_cpu_fp16", "executorch_portable_fp32",
           "executorch_portable_fp16", "coreml_any_fp32", "coreml_any_fp16"]
KINDS = {"backend-limit": "backend limit", "tolerance": "tolerance choice",
         "upstream-bug": "bug worth reporting upstream", "platform": "platform (cannot run here)",
         "test-design": "test design"}


@dataclass
class Rule:
    preset: str
    test: list[str]
    status: str
    match: str
    kind: str
    why: str

    def explains(self, preset: str, test: str, status: str, message: str) -> bool:
        return (fnmatch.fnmatchcase(preset, self.preset)
                and any(fnmatch.fnmatchcase(test, t) for t in self.test)
                and fnmatch.fnmatchcase(status, self.status)
                and (not self.match or re.search(self.match, message or "", re.S) is not None))


def load_rules(path: Path) -> list[Rule]:
    rules = []
    for i, r in enumerate(yaml.safe_load(path.read_text()) or []):
        unknown = set(r) - {"preset", "test", "status", "match", "kind", "why"}
        if unknown or r.get("kind") not in KINDS or not r.get("why"):
            raise SystemExit(f"{path}: rule {i}: needs kind in {sorted(KINDS)} and why; unknown keys {unknown}")
        tests = r.get("test", "*")
        rules.append(Rule(r.get("preset", "*"), [tests] if isinstance(tests, str) else list(tests),
                          r.get("status", "*"),
                          r.get("match", ""), r["kind"], r["why"]))
    return rules


def run_checks(presets: list[str], jobs: int, store: Path) -> None:
    for preset in presets:
        print(f"== checking {preset}", flush=True)
        subprocess.run([sys.executable, str(ROOT / "cli.py"), "--store", str(store), "check", "-b", preset,
                        "-j", str(jobs),
                        "--repeats", "3", "--fail-on", "CRASH"], cwd=ROOT, check=False)


def latest_results(store: Path, presets: list[str]) -> dict[tuple[str, str], tuple[str, str, float | None]]:
    """(test, preset) -> (status, message, min_atol) from the latest check run that has it."""
    with connect(store, warn=False) as a:
        t = a.sql("""
            SELECT r.test_id, r.preset, r.status, r.error_message, r.min_atol
            FROM results r JOIN runs USING (run_id)
            WHERE runs.command = 'check' AND r.seed = 0
            QUALIFY row_number() OVER (PARTITION BY r.test_id, r.preset
                                       ORDER BY runs.started DESC, r.ts DESC) = 1""")
    return {(test, preset): (status, msg or "", min_atol) for test, preset, status, msg, min_atol in t.rows
            if preset in presets}


def tolerance_choices(page: str) -> dict[str, set[str]]:
    """preset -> tests a results page explains as MISMATCH by a tolerance choice."""
    out: dict[str, set[str]] = defaultdict(set)
    preset = None
    for line in page.splitlines():
        if line.startswith("## "):
            preset = line[3:].strip()
        elif preset and line.startswith("| MISMATCH |") and f"| {KINDS['tolerance']} |" in line:
            out[preset].update(re.findall(r"`([^`]+)`", line.split("|")[2]))
    return out


KEPT_BLOCK = re.compile(r"<!-- kept: (?P<name>[\w-]+) -->.*?<!-- end kept: (?P=name) -->", re.S)


def kept_blocks(page: str) -> list[str]:
    """Sections of a page written by hand between `<!-- kept: NAME -->` and
    `<!-- end kept: NAME -->` markers (localize's findings): regenerating keeps them."""
    return [m.group(0) for m in KEPT_BLOCK.finditer(page)]


def write_page(results, rules: list[Rule], presets: list[str], out: Path, before: str | None = None) -> int:
    tests = sorted({t for t, _ in results})
    counts = {p: Counter(results[(t, p)][0] for t in tests if (t, p) in results) for p in presets}
    worst = {p: max((results[(t, p)][2] for t in tests if (t, p) in results
                     and results[(t, p)][2] is not None), default=None) for p in presets}
    lines = ["# Results: the shipped suites on every preset that runs here", "",
             "Generated by `python tools/results_page.py --run` from real `opdiff check` runs on this",
             "project's machine (2-core Linux x86-64, CPU only; torch 2.13.0, onnxruntime 1.31.1,",
             "executorch 1.5.1, coremltools 9.0) against the shipped goldens (baseline torch_cpu_fp32,",
             f"{len(tests)} tests). Every non-PASS is explained below by a rule in",
             "`docs/results-notes.yaml`: a backend limit, a tolerance choice, or a bug worth",
             "reporting upstream. Every test not listed under a preset passed on it. Verdicts follow",
             "docs/check.md: a result passes within its tolerance, within 4x the golden's own",
             "float64-measured rounding error, or within tolerance of the float64 reference; the",
             "goldens were recorded on another machine, so the baseline preset's own row is the",
             "cross-machine check.", "",
             "![support heatmap: the op families that fail most, on the presets that run end to end here]"
             "(img/results-heatmap.png)", "", "## Summary", ""]
    verdicts = sorted({v for c in counts.values() for v in c})
    lines.append("| preset | " + " | ".join(verdicts) + " | worst min_atol |")
    lines.append("| --- |" + " --- |" * (len(verdicts) + 1))
    for p in presets:
        w = "" if worst[p] is None else f"{worst[p]:.3g}"
        lines.append(f"| {p} | " + " | ".join(str(counts[p].get(v, 0) or "") for v in verdicts) + f" | {w} |")
    lines += ["", "`worst min_atol`: the largest absolute tolerance any compared result of the preset",
              "would need to pass with rtol unchanged (`min_atol` in the `results` view)."]
    if before is not None:
        then = tolerance_choices(before)
        now: dict[str, set[str]] = defaultdict(set)
        for (t, p), (status, message, _) in results.items():
            rule = next((r for r in rules if r.explains(p, t, status, message)), None)
            if status == Verdict.MISMATCH and rule is not None and rule.kind == "tolerance":
                now[p].add(t)
        lines += ["", "## Tolerance choices before and after the rounding policy", "",
                  "MISMATCH results explained only as a tolerance choice, from the previous page (the",
                  "configured tolerances alone, pairs judged b against a) and from this one:", "",
                  "| preset | before | after | no longer MISMATCH |", "| --- | --- | --- | --- |"]
        for p in presets:
            if then.get(p) or now.get(p):
                gone = sorted(then.get(p, set()) - now.get(p, set()))
                lines.append(f"| {p} | {len(then.get(p, ()))} | {len(now.get(p, ()))} | "
                             f"{', '.join(f'`{x}`' for x in gone)} |")
    unexplained = 0
    for p in presets:
        groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
        for t in tests:
            if (t, p) not in results:
                continue
            status, message, _ = results[(t, p)]
            if status == Verdict.PASS:
                continue
            rule = next((r for r in rules if r.explains(p, t, status, message)), None)
            if rule is None:
                unexplained += 1
                groups[("UNEXPLAINED", status, headline(message))].append(t)
            else:
                groups[(KINDS[rule.kind], status, rule.why)].append(t)
        if not groups:
            continue
        lines += ["", f"## {p}", "", "| verdict | tests | kind | why |", "| --- | --- | --- | --- |"]
        for (kind, status, why), ts in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            lines.append(f"| {status} | {', '.join(f'`{x}`' for x in ts)} | {kind} | {why} |")
    for block in kept_blocks(out.read_text()) if out.exists() else []:
        lines += ["", block]
    out.write_text("\n".join(lines) + "\n")
    return unexplained


def write_heatmap(store: Path, presets: list[str], path: Path) -> None:
    """The support heatmap of the presets that run end to end here (CoreML columns would
    be all UNAVAILABLE: conversion is checked, prediction needs macOS)."""
    from opdiff_snap.analytics import Table
    from opdiff_snap.analytics.plots import support_heatmap
    from opdiff_snap.analytics.reports import support_matrix

    matrix = support_matrix(store)
    keep = [0] + [i for i, c in enumerate(matrix.columns) if c in presets]
    table = Table([matrix.columns[i] for i in keep], [tuple(row[i] for i in keep) for row in matrix.rows])
    path.parent.mkdir(parents=True, exist_ok=True)
    support_heatmap(table, path, title="Shipped suites on the presets that run here")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="run opdiff check for every preset first")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--store", type=Path, default=ROOT / "store")
    ap.add_argument("--notes", type=Path, default=ROOT / "docs" / "results-notes.yaml")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "results.md")
    ap.add_argument("--before", type=Path, help="an earlier results page, for the before/after table")
    args = ap.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    if args.run:
        run_checks(presets, args.jobs, args.store)
    results = latest_results(args.store, presets)
    before = args.before.read_text() if args.before else None
    unexplained = write_page(results, load_rules(args.notes), presets, args.output, before)
    write_heatmap(args.store, [p for p in presets if not p.startswith("coreml_")],
                  args.output.parent / "img" / "results-heatmap.png")
    print(f"wrote {args.output}; {unexplained} non-PASS results without an explanation")
    sys.exit(1 if unexplained else 0)


if __name__ == "__main__":
    main()
