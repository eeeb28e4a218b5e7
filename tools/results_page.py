"""Generate docs/results.md: the shipped suites on every preset that runs here, from real
runs, with every non-PASS explained by a rule in docs/results-notes.yaml.

    python tools/results_page.py --run            # check every preset into store/, then write
    python tools/results_page.py                  # write from the history already in store/
    python tools/results_page.py --before OLD.md  # also: tolerance-choice MISMATCHes then and now
    python tools/results_page.py --run-coverage   # also check suites/opinfo and suites/zoo first
    python tools/results_page.py --coverage-only [--run-coverage]   # only that section of the page

The hand-written suites (suites/*.yaml) get a row per non-PASS, each explained; the
OpInfo and zoo suites get counts per verdict and their most common causes.

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
from opdiff_snap.suite.dynamic import unsized_id  # noqa: E402

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
        """A rule for a test explains its sized tests (dynamic shapes, `<id>@B=9`) too, where
        status and message agree: a rule earlier in the file says what only dynamic shapes cause."""
        sized = unsized_id(test)
        return (fnmatch.fnmatchcase(preset, self.preset)
                and any(fnmatch.fnmatchcase(test, t) or fnmatch.fnmatchcase(sized, t) for t in self.test)
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


HAND_WRITTEN = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "suites").glob("*.yaml"))
COVERAGE = ("opinfo", "zoo")   # the tags of the suites nobody here wrote: suites/opinfo, suites/zoo
COVERAGE_PRESETS = ["torch_cpu_fp16", "onnx_cpu_fp32", "executorch_cpu_fp32", "executorch_cpu_fp16",
                    "coreml_any_fp16"]
# coverage runs ask for verdicts only: ExecuTorch then compiles each batch of tests into one
# program (its results carry no latency, which the coverage section does not report)
VERDICTS_ONLY = {"executorch_cpu_fp32": '{"batch_program": true}', "executorch_cpu_fp16": '{"batch_program": true}'}


def _check(store: Path, jobs: int, presets: list[str], suites: list[str], repeats: int = 3,
           options: dict[str, str] | None = None) -> None:
    print(f"== checking {', '.join(presets)} on {', '.join(suites)}", flush=True)
    cmd = [sys.executable, str(ROOT / "cli.py"), "--store", str(store), "check", *suites,
           *(a for p in presets for a in ("-b", p)), "-j", str(jobs), "--repeats", str(repeats),
           "--fail-on", "CRASH"]
    for preset, value in (options or {}).items():
        if preset in presets:
            cmd += ["--preset-options", f"{preset}={value}"]
    subprocess.run(cmd, cwd=ROOT, check=False)


def run_checks(presets: list[str], jobs: int, store: Path) -> None:
    """The hand-written suites (suites/*.yaml), one preset at a time."""
    for preset in presets:
        _check(store, jobs, [preset], HAND_WRITTEN)


def run_coverage(presets: list[str], jobs: int, store: Path) -> None:
    """suites/opinfo (every sample) and suites/zoo, every preset in one run each."""
    for suite in ("suites/opinfo", "suites/zoo"):
        _check(store, jobs, presets, [suite], repeats=1, options=VERDICTS_ONLY)


def coverage_results(store: Path, presets: list[str]) -> list[tuple]:
    """(source tag, test, preset, status, message, [ops it cannot lower]) of the latest
    check of every OpInfo and zoo test."""
    with connect(store, warn=False) as a:
        t = a.sql("""
            SELECT list_filter(r.tags, lambda t: t IN ('opinfo', 'zoo'))[1] AS source, r.test_id, r.preset,
                   r.status, r.error_message, [u.op FOR u IN coalesce(r.unsupported_ops, [])]
            FROM results r JOIN runs USING (run_id)
            WHERE runs.command = 'check' AND r.seed = 0
              AND len(list_filter(r.tags, lambda t: t IN ('opinfo', 'zoo'))) > 0
            QUALIFY row_number() OVER (PARTITION BY r.test_id, r.preset
                                       ORDER BY runs.started DESC, r.ts DESC) = 1""")
    return [row for row in t.rows if row[2] in presets]


def _op_of(test_id: str) -> str:
    return test_id.removeprefix("opinfo.").rsplit(".", 2)[0]


def coverage_lines(rows: list[tuple], presets: list[str], top: int = 8) -> list[str]:
    lines = ["", f"{COVERAGE_HEADING}: OpInfo and the model zoo", "",
             "Generated by `python tools/results_page.py --coverage-only --run-coverage`.",
             "`suites/opinfo` holds torch's own OpInfo samples (`opdiff import opinfo`,",
             "docs/coverage.md) and `suites/zoo` tiny real architectures built from `transformers`",
             "configs with random weights. Every sample is checked on every preset below (ExecuTorch",
             "with `batch_program`, one program per batch of tests: verdicts only, docs/check.md).",
             "These results are counted, not explained one by one: the causes below are the first",
             "lines of the messages, grouped."]
    for source in COVERAGE:
        mine = [r for r in rows if r[0] == source]
        if not mine:
            continue
        verdicts = sorted({r[3] for r in mine}, key=lambda v: (v != "PASS", v))
        title = "OpInfo samples" if source == "opinfo" else "Model zoo"
        lines += ["", f"### {title}", "",
                  "| preset | tests | " + ("ops | " if source == "opinfo" else "") + " | ".join(verdicts) + " |",
                  "| --- | --- |" + (" --- |" if source == "opinfo" else "") + " --- |" * len(verdicts)]
        for p in presets:
            here = [r for r in mine if r[2] == p]
            if not here:
                continue
            c = Counter(r[3] for r in here)
            ops = f"{len({_op_of(r[1]) for r in here})} | " if source == "opinfo" else ""
            lines.append(f"| {p} | {len(here)} | {ops}" + " | ".join(str(c.get(v, "")) for v in verdicts) + " |")
        for p in presets:
            failing = [r for r in mine if r[2] == p and r[3] not in ("PASS", "SKIPPED", "UNAVAILABLE")]
            if not failing:
                continue
            lines += ["", f"#### {title} on {p}: {len(failing)} failing", ""]
            if source == "zoo":
                lines += ["| test | verdict | why |", "| --- | --- | --- |"]
                lines += [f"| `{r[1]}` | {r[3]} | {headline(r[4] or '').replace('|', '/')}"
                          + (f" (cannot lower: {', '.join(f'`{op}`' for op in r[5])})" if r[5] else "") + " |"
                          for r in sorted(failing)]
                continue
            lowering = Counter(op for r in failing for op in set(r[5]))
            if lowering:
                lines += ["ATen ops it cannot lower, by the number of failing samples that hold them: "
                          + ", ".join(f"`{op}` {n}" for op, n in lowering.most_common(top)) + ".", ""]
            causes: dict[tuple[str, str], list[str]] = defaultdict(list)
            for r in failing:
                causes[(r[3], headline(r[4] or "")[:160])].append(_op_of(r[1]))
            ranked = sorted(causes.items(), key=lambda kv: (-len(set(kv[1])), kv[0]))
            lines += ["| verdict | ops | cause (first line) | e.g. |", "| --- | --- | --- | --- |"]
            for (status, cause), ops in ranked[:top]:
                names = sorted(set(ops))
                lines.append(f"| {status} | {len(names)} | {cause.replace('|', '/')} | "
                             f"{', '.join(f'`{n}`' for n in names[:4])} |")
            if len(ranked) > top:
                lines.append(f"| | {len({o for _, ops in ranked[top:] for o in ops})} | "
                             f"{len(ranked) - top} other causes | |")
    return lines


def latest_results(store: Path, presets: list[str]) -> dict[tuple[str, str], tuple[str, str, float | None]]:
    """(test, preset) -> (status, message, min_atol) from the latest check run that has it."""
    with connect(store, warn=False) as a:
        t = a.sql("""
            SELECT r.test_id, r.preset, r.status, r.error_message, r.min_atol
            FROM results r JOIN runs USING (run_id)
            WHERE runs.command = 'check' AND r.seed = 0
              AND len(list_filter(coalesce(r.tags, []), lambda t: t IN ('opinfo', 'zoo'))) = 0
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


def write_page(results, rules: list[Rule], presets: list[str], out: Path, before: str | None = None,
               coverage: list[str] | None = None) -> int:
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
    lines += coverage or []
    for block in kept_blocks(out.read_text()) if out.exists() else []:
        lines += ["", block]
    out.write_text("\n".join(lines) + "\n")
    return unexplained


COVERAGE_HEADING = "## Coverage nobody here wrote"


def write_coverage(out: Path, coverage: list[str]) -> None:
    """Replace only the OpInfo and zoo section of an existing page (before its kept
    blocks), leaving the hand-written suites' part as it was generated."""
    page = out.read_text()
    kept = page.find("<!-- kept:")
    head, tail = (page[:kept], page[kept:]) if kept >= 0 else (page, "")
    start = head.find(COVERAGE_HEADING)
    head = (head[:start] if start >= 0 else head).rstrip("\n")
    out.write_text(head + "\n" + "\n".join(coverage) + "\n" + ("\n" + tail if tail else ""))


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
    ap.add_argument("--run-coverage", action="store_true",
                    help="check suites/opinfo and suites/zoo on the coverage presets first")
    ap.add_argument("--coverage-presets", default=",".join(COVERAGE_PRESETS))
    ap.add_argument("--coverage-store", type=Path,
                    help="history of the OpInfo and zoo checks (default: --store)")
    ap.add_argument("--coverage-only", action="store_true",
                    help="rewrite only the OpInfo and zoo section of the existing page")
    args = ap.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    coverage_presets = [p for p in args.coverage_presets.split(",") if p]
    coverage_store = args.coverage_store or args.store
    if args.run:
        run_checks(presets, args.jobs, args.store)
    if args.run_coverage:
        run_coverage(coverage_presets, args.jobs, coverage_store)
    coverage = coverage_lines(coverage_results(coverage_store, coverage_presets), coverage_presets)
    if args.coverage_only:
        write_coverage(args.output, coverage)
        print(f"wrote the OpInfo and zoo section of {args.output}")
        return
    results = latest_results(args.store, presets)
    before = args.before.read_text() if args.before else None
    unexplained = write_page(results, load_rules(args.notes), presets, args.output, before, coverage)
    write_heatmap(args.store, [p for p in presets if not p.startswith("coreml_")],
                  args.output.parent / "img" / "results-heatmap.png")
    print(f"wrote {args.output}; {unexplained} non-PASS results without an explanation")
    sys.exit(1 if unexplained else 0)


if __name__ == "__main__":
    main()
