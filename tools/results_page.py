"""Generate docs/results.md: the shipped suites on every preset that runs here, from real
runs, with every non-PASS explained by a rule in docs/results-notes.yaml.

    python tools/results_page.py --run            # check every preset into store/, then write
    python tools/results_page.py                  # write from the history already in store/
    python tools/results_page.py --before OLD.md  # also: tolerance-choice MISMATCHes then and now
    python tools/results_page.py --run-coverage   # also check suites/opinfo and suites/zoo first
    python tools/results_page.py --coverage-only [--run-coverage]   # only that section of the page

The hand-written suites (suites/*.yaml) get a row per non-PASS, each explained, and say
where a result is not what expectations.yaml expects. The OpInfo and zoo suites (about
4,000 tests, hours per preset here) are read from expectations.yaml, which holds their
known failures on the coverage presets with a reason each: counts per verdict and the
reasons that cover the most ops. --run-coverage checks them again first, each run
rewriting its preset's entries (`--update-expectations`).

A non-PASS that no rule explains is listed as UNEXPLAINED, and so is a known failure with
no reason written; either makes the script exit 1, so the page can never silently carry
an unexplained failure.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
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
from opdiff_snap.core.verdicts import FAILING, PASSING, QUIET, Verdict  # noqa: E402
from opdiff_snap.suite.dynamic import unsized_id  # noqa: E402

# every preset that runs here (CoreML's two only convert): the presets expectations.yaml holds
PRESETS = ["torch_cpu_fp32", "torch_cpu_fp16", "torch_cpu_bf16",
           "inductor_cpu_fp32", "inductor_cpu_fp16", "inductor_cpu_bf16", "inductor_cpu_int8", "inductor_cpu_int8dyn",
           "onnx_cpu_fp32", "onnx_cpu_fp16", "onnx_cpu_int8", "onnx_cpu_int8pt", "onnx_cpu_int8dyn",
           "executorch_cpu_fp32", "executorch_cpu_fp16", "executorch_cpu_int8", "executorch_cpu_int8pt",
           "executorch_cpu_int8dyn", "executorch_portable_fp32", "executorch_portable_fp16",
           "coreml_any_fp32", "coreml_any_fp16"]
UNTRIAGED = "not triaged yet"   # the reason tools/expectation_reasons.py --untriaged writes meanwhile
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
COVERAGE = {"opinfo": "OpInfo samples", "zoo": "Model zoo"}   # the suites nobody here wrote, by tag
# the presets on which expectations.yaml holds the known failures of suites/opinfo and suites/zoo
COVERAGE_PRESETS = ["torch_cpu_fp16", "torch_cpu_bf16", "onnx_cpu_fp32", "onnx_cpu_fp16", "executorch_cpu_fp32",
                    "executorch_cpu_fp16", "coreml_any_fp16"]
# the page reports verdicts, not latency: ExecuTorch's cpu and portable presets compile each
# batch of tests into one program (docs/check.md; its results carry no infer_ms, and any
# result but PASS is run again alone)
VERDICTS_ONLY = {p: '{"batch_program": true}' for p in ("executorch_cpu_fp32", "executorch_cpu_fp16",
                                                        "executorch_portable_fp32", "executorch_portable_fp16")}
# OpInfo test ids name the sample's dtype; an edge-value golden carries its profile after "@"
KIND_OF_SAMPLE = {"float32": ".f32.", "float16": ".f16.", "bfloat16": ".bf16."}


def _check(store: Path, jobs: int, presets: list[str], suites: list[str], repeats: int = 3,
           options: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> None:
    print(f"== checking {', '.join(presets)} on {', '.join(suites)}", flush=True)
    cmd = [sys.executable, str(ROOT / "cli.py"), "--store", str(store), "check", *suites,
           *(a for p in presets for a in ("-b", p)), "-j", str(jobs), "--repeats", str(repeats),
           "--fail-on", "CRASH", *extra]
    for preset, value in (options or {}).items():
        if preset in presets:
            cmd += ["--preset-options", f"{preset}={value}"]
    subprocess.run(cmd, cwd=ROOT, check=False)


def run_checks(presets: list[str], jobs: int, store: Path) -> None:
    """The hand-written suites (suites/*.yaml), one preset at a time."""
    for preset in presets:
        _check(store, jobs, [preset], HAND_WRITTEN, options=VERDICTS_ONLY)


def run_coverage(presets: list[str], jobs: int, store: Path, expectations: Path, notes: Path) -> None:
    """suites/opinfo (every sample) and suites/zoo, one preset at a time, each run making
    the expectations file agree with what it found; then the new entries get their reasons
    from the notes (tools/expectation_reasons.py)."""
    runs = store / "runs"
    before = set(runs.glob("*.jsonl"))
    for preset in presets:
        _check(store, jobs, [preset], ["suites/opinfo", "suites/zoo"], repeats=1, options=VERDICTS_ONLY,
               extra=("--expectations", str(expectations), "--update-expectations"))
    new = sorted(set(runs.glob("*.jsonl")) - before)
    if new:
        subprocess.run([sys.executable, str(ROOT / "tools" / "expectation_reasons.py"), "--expectations",
                        str(expectations), "--notes", str(notes), *map(str, new)], cwd=ROOT, check=False)


@dataclass(frozen=True)
class Known:
    """What the expectations file says of one seed of one OpInfo or zoo test on one preset:
    `verdict` None where it has no entry (the test passes there; on a preset that only
    converts here, it converts)."""

    source: str
    test: str
    preset: str
    verdict: str | None
    reason: str


def load_expectations(path: Path):
    from opdiff_snap import api

    exps = api.load_expectations(path)
    if exps is None:
        raise SystemExit(f"{path}: no expectations file; the page reads the known failures from it")
    return exps


def coverage_known(exps, presets: list[str]) -> list[Known]:
    from opdiff_snap import api

    tests = api.list_tests([ROOT / "suites" / "opinfo", ROOT / "suites" / "zoo"])
    known = []
    for case in tests:
        source = next((tag for tag in COVERAGE if tag in case.tags), None)
        if source is None:
            continue
        for seed in case.seeds:
            for preset in presets:
                e = exps.match(preset, case.id, seed)
                known.append(Known(source, case.id, preset, None if e is None else str(e.verdict),
                                   "" if e is None else e.reason))
    return known


def _op_of(test_id: str) -> str:
    return test_id.removeprefix("opinfo.").rsplit(".", 2)[0]


def _kind_of(test_id: str) -> str:
    if "@" in test_id:
        return "edge values"
    return next((kind for kind, mark in KIND_OF_SAMPLE.items() if mark in test_id), "float32")


def _n(count: int) -> str:
    return f"{count:,}"


def coverage_lines(known: list[Known], presets: list[str], top: int = 8) -> tuple[list[str], int]:
    """The OpInfo and zoo section, and how many of its failures have no reason written."""
    lines = ["", f"{COVERAGE_HEADING}: OpInfo and the model zoo", "",
             "Generated by `python tools/results_page.py` from `expectations.yaml`, which holds, for",
             "each preset below, every OpInfo and zoo test that does not pass, with its verdict and",
             "why. Every sample was checked on each of them (`python tools/results_page.py",
             "--coverage-only --run-coverage` checks them again, each run rewriting its preset's",
             "entries: `opdiff check --update-expectations`), and `opdiff check -b P suites/opinfo",
             "suites/zoo` exits 0 only while the file still agrees. `suites/opinfo` holds torch's own",
             "OpInfo samples (`opdiff import opinfo`, docs/coverage.md) and `suites/zoo` tiny real",
             "architectures built from `transformers` configs with random weights. A test with no",
             "entry passes; on coreml_any_fp16, which predicts only on macOS, it converts."]
    unreasoned = 0
    for source, title in COVERAGE.items():
        mine = [k for k in known if k.source == source]
        if not mine:
            continue
        verdicts = sorted({k.verdict for k in mine if k.verdict})
        opinfo = source == "opinfo"
        lines += ["", f"### {title}", "",
                  "| preset | tests | " + ("ops | " if opinfo else "") + "no entry | " + " | ".join(verdicts) + " |",
                  "| --- | --- |" + (" --- |" if opinfo else "") + " --- |" * (len(verdicts) + 1)]
        for p in presets:
            here = [k for k in mine if k.preset == p]
            c = Counter(k.verdict for k in here)
            ops = f"{_n(len({_op_of(k.test) for k in here}))} | " if opinfo else ""
            lines.append(f"| {p} | {_n(len(here))} | {ops}{_n(c[None])} | "
                         + " | ".join(_n(c[v]) if c[v] else "" for v in verdicts) + " |")
        if opinfo:
            kinds = ["float32", "float16", "bfloat16", "edge values"]
            total = Counter(_kind_of(k.test) for k in mine if k.preset == presets[0])
            lines += ["", "With no entry, per kind of golden (float32 on edge values: the profiles of",
                      "docs/suite-format.md):", "",
                      "| preset | " + " | ".join(f"{kind} ({_n(total[kind])})" for kind in kinds) + " |",
                      "| --- |" + " --- |" * len(kinds)]
            for p in presets:
                c = Counter(_kind_of(k.test) for k in mine if k.preset == p and k.verdict is None)
                lines.append(f"| {p} | " + " | ".join(_n(c[kind]) for kind in kinds) + " |")
        for p in presets:
            failing = [k for k in mine if k.preset == p and k.verdict]
            if not failing:
                continue
            unreasoned += sum(1 for k in failing if not explained(k.reason))
            lines += ["", f"#### {title} on {p}: {_n(len(failing))} known failures", ""]
            if not opinfo:
                lines += ["| test | verdict | why |", "| --- | --- | --- |"]
                lines += [f"| `{k.test}` | {k.verdict} | {_cell(k.reason)} |" for k in sorted(failing, key=_key)]
                continue
            causes: dict[tuple[str, str], list[str]] = defaultdict(list)
            for k in failing:
                causes[(k.verdict or "", k.reason)].append(k.test)
            ranked = sorted(causes.items(), key=lambda kv: (-len({_op_of(t) for t in kv[1]}), kv[0]))
            lines += ["| verdict | tests | ops | why | e.g. |", "| --- | --- | --- | --- | --- |"]
            for (status, reason), ts in ranked[:top]:
                names = sorted({_op_of(t) for t in ts})
                lines.append(f"| {status} | {_n(len(ts))} | {_n(len(names))} | {_cell(reason)} | "
                             f"{', '.join(f'`{n}`' for n in names[:4])} |")
            if len(ranked) > top:
                rest = [t for _, ts in ranked[top:] for t in ts]
                lines.append(f"| | {_n(len(rest))} | {_n(len({_op_of(t) for t in rest}))} | "
                             f"{len(ranked) - top} other reasons (`expectations.yaml`) | |")
    return lines, unreasoned


def _key(k: Known) -> tuple[str, str]:
    return k.test, k.verdict or ""


def explained(reason: str) -> bool:
    return bool(reason) and not reason.startswith(UNTRIAGED)


def _cell(reason: str) -> str:
    if not reason:
        return "UNEXPLAINED: no reason written"
    return ("" if explained(reason) else "UNEXPLAINED, ") + reason.replace("|", "/")


@dataclass(frozen=True)
class Latest:
    """The latest checked result of one hand-written test on one preset, and the verdict the
    expectations file expected of it in that run (None: no entry held)."""

    status: str
    message: str = ""
    min_atol: float | None = None
    expected: str | None = None

    def against_expectations(self) -> str | None:
        """How the result stands against the expectations file: None where as expected."""
        if self.status in FAILING:
            if self.expected is None:
                return "new failure"
            return "different failure" if self.expected != self.status else None
        if self.status in PASSING and self.expected is not None:
            return "unexpected pass"
        return None


def latest_results(a, presets: list[str]) -> dict[tuple[str, str], Latest]:
    """(test, preset) -> the result of the latest check run that has it (`a`: the store's
    history, analytics.connect)."""
    t = a.sql("""
        SELECT r.test_id, r.preset, r.status, r.error_message, r.min_atol, r.expected
        FROM results r JOIN runs USING (run_id)
        WHERE runs.command = 'check' AND r.seed = 0
          AND len(list_filter(coalesce(r.tags, []), lambda t: t IN ('opinfo', 'zoo'))) = 0
        QUALIFY row_number() OVER (PARTITION BY r.test_id, r.preset
                                   ORDER BY runs.started DESC, r.ts DESC) = 1""")
    return {(test, preset): Latest(status, msg or "", min_atol, expected)
            for test, preset, status, msg, min_atol, expected in t.rows if preset in presets}


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


def write_page(results: dict[tuple[str, str], Latest], rules: list[Rule], presets: list[str], out: Path,
               before: str | None = None, coverage: list[str] | None = None, made_with: str = "",
               checked: dict[str, str] | None = None, known: dict[str, int] | None = None) -> int:
    """Write the page; returns how many non-PASS results no rule explains. `checked`: when
    each preset's results were checked; `known`: how many known failures of the hand-written
    suites the expectations file holds for a preset the store has no check of."""
    tests = sorted({t for t, _ in results})
    mine = {p: [(t, results[(t, p)]) for t in tests if (t, p) in results] for p in presets}
    counts = {p: Counter(r.status for _, r in mine[p]) for p in presets}
    worst = {p: max((r.min_atol for _, r in mine[p] if r.min_atol is not None), default=None) for p in presets}
    lines = ["# Results: the shipped suites on every preset that runs here", "",
             "Generated by `python tools/results_page.py --run` from real `opdiff check` runs on this",
             "project's machine (2-core Linux x86-64, CPU only" + (f"; {made_with}" if made_with else "") + ")",
             f"against the shipped goldens (baseline torch_cpu_fp32, {len(tests)} tests of `suites/*.yaml`).",
             "Every non-PASS is explained below by a rule in `docs/results-notes.yaml`: a backend limit,",
             "a tolerance choice, or a bug worth reporting upstream. Every test not listed under a",
             "preset passed on it. Verdicts follow",
             "docs/check.md: a result passes within its tolerance, within 4x the golden's own",
             "float64-measured rounding error, or within tolerance of the float64 reference; the",
             "baseline preset's own row checks the stored goldens against a fresh run of the baseline.",
             "Each run was judged against `expectations.yaml` (docs/check.md, \"Known failures\"); the",
             "`against expectations.yaml` column says where a result is not what that file expects, and",
             "`checked` when the preset's run started (UTC) and whether it compiled each batch of tests",
             "into one program (`batch_program`, which `--run` asks of ExecuTorch's cpu and portable",
             "fp32/fp16 presets; docs/check.md: verdicts only, any result but PASS run again alone).", "",
             "![support heatmap: the op families that fail most, on the presets that run end to end here]"
             "(img/results-heatmap.png)", "", "## Summary", ""]
    verdicts = sorted({v for c in counts.values() for v in c})
    lines.append("| preset | " + " | ".join(verdicts) + " | worst min_atol | against expectations.yaml | checked |")
    lines.append("| --- |" + " --- |" * (len(verdicts) + 3))
    for p in presets:
        if not mine[p]:
            lines.append(f"| {p} |" + " |" * len(verdicts) + " | not checked for this page: "
                         f"{(known or {}).get(p, 0)} known failures in expectations.yaml | |")
            continue
        w = "" if worst[p] is None else f"{worst[p]:.3g}"
        standing = Counter(s for _, r in mine[p] if (s := r.against_expectations()))
        agree = ", ".join(f"{n} {s}" + ("s" if n > 1 else "") for s, n in sorted(standing.items())) or "as expected"
        lines.append(f"| {p} | " + " | ".join(str(counts[p].get(v, 0) or "") for v in verdicts)
                     + f" | {w} | {agree} | {(checked or {}).get(p, '')} |")
    lines += ["", "`worst min_atol`: the largest absolute tolerance any compared result of the preset",
              "would need to pass with rtol unchanged (`min_atol` in the `results` view)."]
    if before is not None:
        then = tolerance_choices(before)
        now: dict[str, set[str]] = defaultdict(set)
        for (t, p), r in results.items():
            rule = next((x for x in rules if x.explains(p, t, r.status, r.message)), None)
            if r.status == Verdict.MISMATCH and rule is not None and rule.kind == "tolerance":
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
        for t, r in mine[p]:
            if r.status == Verdict.PASS:
                continue
            rule = next((x for x in rules if x.explains(p, t, r.status, r.message)), None)
            if rule is None:
                unexplained += 1
                groups[("UNEXPLAINED", r.status, headline(r.message))].append(t)
            else:
                groups[(KINDS[rule.kind], r.status, rule.why)].append(t)
        odd = [f"`{t}` ({s})" for t, r in mine[p] if (s := r.against_expectations())]
        if not groups and not odd:
            continue
        lines += ["", f"## {p}"]
        if groups:
            lines += ["", "| verdict | tests | kind | why |", "| --- | --- | --- | --- |"]
        for (kind, status, why), ts in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            named = f"{len(ts)} tests" if status in QUIET else ", ".join(f"`{x}`" for x in ts)
            lines.append(f"| {status} | {named} | {kind} | {why} |")
        if odd:
            lines += ["", "Not what `expectations.yaml` expects: " + ", ".join(odd) + "."]
    lines += coverage or []
    for block in kept_blocks(out.read_text()) if out.exists() else []:
        lines += ["", block]
    out.write_text("\n".join(lines) + "\n")
    return unexplained


def checked_on(a) -> dict[str, str]:
    """preset -> when its latest check of the hand-written suites started (UTC), and
    whether that run compiled batch programs (its command line, in the run file's head)."""
    t = a.sql("""
        SELECT r.preset, strftime(max(runs.started), '%Y-%m-%d %H:%M'), arg_max(runs.file, runs.started)
        FROM results r JOIN runs USING (run_id)
        WHERE runs.command = 'check'
          AND len(list_filter(coalesce(r.tags, []), lambda t: t IN ('opinfo', 'zoo'))) = 0
        GROUP BY r.preset""")
    checked = {}
    for preset, started, file in t.rows:
        with open(file, encoding="utf-8") as f:
            argv = json.loads(f.readline()).get("argv", [])
        checked[preset] = started + (", batch_program" if any("batch_program" in arg for arg in argv) else "")
    return checked


def known_hand_written(exps, presets: list[str]) -> dict[str, int]:
    """preset -> how many entries of the expectations file name a hand-written test on it."""
    return {p: sum(1 for e in exps.entries if e.preset == p and not e.test.startswith(("opinfo.", "zoo_")))
            for p in presets}


def made_with(a) -> str:
    """The versions of the latest check run, as the page's first paragraph names them."""
    t = a.sql("""SELECT torch, onnxruntime, executorch, coremltools FROM runs
                 WHERE command = 'check' ORDER BY started DESC LIMIT 1""")
    if not t.rows:
        return ""
    names = ("torch", "onnxruntime", "executorch", "coremltools")
    return ", ".join(f"{n} {v}" for n, v in zip(names, t.rows[0]) if v)


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
                    help="check suites/opinfo and suites/zoo on the coverage presets first, each run "
                         "rewriting its preset's entries of the expectations file")
    ap.add_argument("--coverage-presets", default=",".join(COVERAGE_PRESETS))
    ap.add_argument("--expectations", type=Path, default=ROOT / "expectations.yaml",
                    help="the known failures the OpInfo and zoo section is read from")
    ap.add_argument("--coverage-only", action="store_true",
                    help="rewrite only the OpInfo and zoo section of the existing page")
    args = ap.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    coverage_presets = [p for p in args.coverage_presets.split(",") if p]
    if args.run:
        run_checks(presets, args.jobs, args.store)
    if args.run_coverage:
        run_coverage(coverage_presets, args.jobs, args.store, args.expectations, args.notes)
    exps = load_expectations(args.expectations)
    coverage, unreasoned = coverage_lines(coverage_known(exps, coverage_presets), coverage_presets)
    if args.coverage_only:
        write_coverage(args.output, coverage)
        print(f"wrote the OpInfo and zoo section of {args.output}; {unreasoned} known failures without a reason")
        sys.exit(1 if unreasoned else 0)
    with connect(args.store, warn=False) as a:   # one reading of the history for the page
        results, checked, made = latest_results(a, presets), checked_on(a), made_with(a)
    before = args.before.read_text() if args.before else None
    unexplained = write_page(results, load_rules(args.notes), presets, args.output, before, coverage,
                             made, checked, known_hand_written(exps, presets))
    write_heatmap(args.store, [p for p in presets if not p.startswith("coreml_")],
                  args.output.parent / "img" / "results-heatmap.png")
    print(f"wrote {args.output}; {unexplained} non-PASS results without an explanation, "
          f"{unreasoned} known OpInfo and zoo failures without a reason")
    sys.exit(1 if unexplained or unreasoned else 0)


if __name__ == "__main__":
    main()
