"""The results page (docs/results.md): the shipped hand-written suites on every preset that
runs here, from the latest check of each in a store's history, every non-PASS explained by
a rule of the notes file (expectations/reasons.py); the OpInfo and zoo section from the
expectations file (coverage_section.py); hand-written blocks of the old page kept.

A non-PASS that no rule explains is listed as UNEXPLAINED, and so is a known failure with
no reason written; `regenerate` counts both, so the page never silently carries one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import headline
from ..core.markdown_text import md_code, md_text
from ..core.verdicts import FAILING, PASSING, QUIET, Verdict
from ..expectations.file import dump
from ..expectations.known import coverage_known, known_hand_written, load_known
from ..expectations.reasons import KINDS, Rule, blaming_the_test, fill_reasons, first_rule, load_rules
from ..history.runs import read_run
from .coverage_section import coverage_lines, write_coverage
from .views import Analytics, connect

# the page reports verdicts, not latency: ExecuTorch's cpu and portable presets compile each
# batch of tests into one program (docs/check.md; its results carry no infer_ms, and any
# result but PASS is run again alone)
VERDICTS_ONLY = {p: '{"batch_program": true}' for p in ("executorch_cpu_fp32", "executorch_cpu_fp16",
                                                        "executorch_portable_fp32", "executorch_portable_fp16")}
HAND_WRITTEN_ONLY = "len(list_filter(coalesce(r.tags, []), lambda t: t IN ('opinfo', 'zoo'))) = 0"
KEPT_BLOCK = re.compile(r"<!-- kept: (?P<name>[\w-]+) -->.*?<!-- end kept: (?P=name) -->", re.S)
INTRO = ["Every non-PASS is explained below by a rule in `docs/results-notes.yaml`: a backend limit,",
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


def latest_results(a: Analytics, presets: list[str]) -> dict[tuple[str, str], Latest]:
    """(test, preset) -> the result of the latest check run that has it."""
    t = a.sql(f"""
        SELECT r.test_id, r.preset, r.status, r.error_message, r.min_atol, r.expected
        FROM results r JOIN runs USING (run_id)
        WHERE runs.command = 'check' AND r.seed = 0
          AND {HAND_WRITTEN_ONLY}
        QUALIFY row_number() OVER (PARTITION BY r.test_id, r.preset
                                   ORDER BY runs.started DESC, r.ts DESC) = 1""")
    return {(test, preset): Latest(status, msg or "", min_atol, expected)
            for test, preset, status, msg, min_atol, expected in t.rows if preset in presets}


def checked_on(a: Analytics) -> dict[str, str]:
    """preset -> when its latest check of the hand-written suites started (UTC), and
    whether that run compiled batch programs (its command line, in the run file's head)."""
    t = a.sql(f"""
        SELECT r.preset, strftime(max(runs.started), '%Y-%m-%d %H:%M'), arg_max(runs.file, runs.started)
        FROM results r JOIN runs USING (run_id)
        WHERE runs.command = 'check'
          AND {HAND_WRITTEN_ONLY}
        GROUP BY r.preset""")
    checked = {}
    for preset, started, file in t.rows:
        with open(file, encoding="utf-8") as f:
            argv = json.loads(f.readline()).get("argv", [])
        checked[preset] = started + (", batch_program" if any("batch_program" in arg for arg in argv) else "")
    return checked


def made_with(a: Analytics) -> str:
    """The versions of the latest check run, as the page's first paragraph names them."""
    t = a.sql("""SELECT torch, onnxruntime, executorch, coremltools FROM runs
                 WHERE command = 'check' ORDER BY started DESC LIMIT 1""")
    if not t.rows:
        return ""
    names = ("torch", "onnxruntime", "executorch", "coremltools")
    return ", ".join(f"{n} {v}" for n, v in zip(names, t.rows[0]) if v)


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
    lines = ["# Results: the shipped suites on every preset that runs here", "",
             "Generated by `python tools/results_page.py --run` from real `opdiff check` runs on this",
             "project's machine (2-core Linux x86-64, CPU only" + (f"; {made_with}" if made_with else "") + ")",
             f"against the shipped goldens (baseline torch_cpu_fp32, {len(tests)} tests of `suites/*.yaml`).",
             *INTRO]
    lines += _summary_lines(mine, checked or {}, known or {})
    if before is not None:
        lines += _tolerance_lines(results, rules, presets, before)
    unexplained = 0
    for p in presets:
        section, count = _preset_lines(p, mine[p], rules)
        lines += section
        unexplained += count
    lines += coverage or []
    for block in kept_blocks(out.read_text()) if out.exists() else []:
        lines += ["", block]
    out.write_text("\n".join(lines) + "\n")
    return unexplained


def _summary_lines(mine: dict[str, list[tuple[str, Latest]]], checked: dict[str, str],
                   known: dict[str, int]) -> list[str]:
    counts = {p: Counter(r.status for _, r in rows) for p, rows in mine.items()}
    verdicts = sorted({v for c in counts.values() for v in c})
    lines = ["| preset | " + " | ".join(map(md_text, verdicts))
             + " | worst min_atol | against expectations.yaml | checked |",
             "| --- |" + " --- |" * (len(verdicts) + 3)]
    for p, rows in mine.items():
        if not rows:
            lines.append(f"| {md_text(p)} |" + " |" * len(verdicts) + " | not checked for this page: "
                         f"{known.get(p, 0)} known failures in expectations.yaml | |")
            continue
        worst = max((r.min_atol for _, r in rows if r.min_atol is not None), default=None)
        w = "" if worst is None else f"{worst:.3g}"
        standing = Counter(s for _, r in rows if (s := r.against_expectations()))
        agree = ", ".join(f"{n} {s}" + ("s" if n > 1 else "") for s, n in sorted(standing.items())) or "as expected"
        lines.append(f"| {md_text(p)} | " + " | ".join(str(counts[p].get(v, 0) or "") for v in verdicts)
                     + f" | {w} | {agree} | {md_text(checked.get(p, ''))} |")
    return lines + ["", "`worst min_atol`: the largest absolute tolerance any compared result of the preset",
                    "would need to pass with rtol unchanged (`min_atol` in the `results` view)."]


def _tolerance_lines(results: dict[tuple[str, str], Latest], rules: list[Rule], presets: list[str],
                     before: str) -> list[str]:
    """MISMATCHes explained as a tolerance choice on an earlier page and on this one."""
    then = tolerance_choices(before)
    now: dict[str, set[str]] = defaultdict(set)
    for (t, p), r in results.items():
        rule = first_rule(rules, p, t, r.status, r.message)
        if r.status == Verdict.MISMATCH and rule is not None and rule.kind == "tolerance":
            now[p].add(t)
    lines = ["", "## Tolerance choices before and after the rounding policy", "",
             "MISMATCH results explained only as a tolerance choice, from the previous page (the",
             "configured tolerances alone, pairs judged b against a) and from this one:", "",
             "| preset | before | after | no longer MISMATCH |", "| --- | --- | --- | --- |"]
    for p in presets:
        if then.get(p) or now.get(p):
            gone = sorted(then.get(p, set()) - now.get(p, set()))
            lines.append(f"| {md_text(p)} | {len(then.get(p, ()))} | {len(now.get(p, ()))} | "
                         f"{', '.join(md_code(x, cell=True) for x in gone)} |")
    return lines


def _preset_lines(preset: str, rows: list[tuple[str, Latest]], rules: list[Rule]) -> tuple[list[str], int]:
    """One preset's section (its non-PASS results grouped by why, and those the expectations
    file does not expect), and how many of them no rule explains."""
    groups: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    unexplained = 0
    for t, r in rows:
        if r.status == Verdict.PASS:
            continue
        rule = first_rule(rules, preset, t, r.status, r.message)
        if rule is None:
            unexplained += 1
            groups[("UNEXPLAINED", r.status, headline(r.message))].append(t)
        else:
            groups[(KINDS[rule.kind], r.status, rule.why)].append(t)
    odd = [f"{md_code(t)} ({s})" for t, r in rows if (s := r.against_expectations())]
    if not groups and not odd:
        return [], unexplained
    lines = ["", f"## {md_text(preset)}"]
    if groups:
        lines += ["", "| verdict | tests | kind | why |", "| --- | --- | --- | --- |"]
    for (kind, status, why), ts in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        named = f"{len(ts)} tests" if status in QUIET else ", ".join(md_code(x, cell=True) for x in ts)
        lines.append(f"| {md_text(status)} | {named} | {kind} | {md_text(why)} |")
    if odd:
        lines += ["", "Not what `expectations.yaml` expects: " + ", ".join(odd) + "."]
    return lines, unexplained


def write_heatmap(store: Path, presets: list[str], path: Path) -> None:
    """The support heatmap of the presets that run end to end here (CoreML columns would
    be all UNAVAILABLE: conversion is checked, prediction needs macOS)."""
    from .plots import support_heatmap
    from .reports import support_matrix
    from .table import Table

    matrix = support_matrix(store)
    keep = [0] + [i for i, c in enumerate(matrix.columns) if c in presets]
    table = Table([matrix.columns[i] for i in keep], [tuple(row[i] for i in keep) for row in matrix.rows])
    path.parent.mkdir(parents=True, exist_ok=True)
    support_heatmap(table, path, title="Shipped suites on the presets that run here")


def fill_reasons_from_runs(expectations: Path, notes: Path, runs: list[Path], refresh: bool = False,
                           untriaged: bool = False) -> None:
    """Fill the reasons of the expectations file's entries from the rules of `notes`, matched
    against the results of the run files `runs` (expectations/reasons.py: fill_reasons)."""
    exps = load_known(expectations)
    items = [item for path in runs for item in read_run(path).items]
    missing = fill_reasons(exps, load_rules(notes), items, refresh, untriaged)
    expectations.write_text(dump(exps))
    print(f"{sum(1 for e in exps.entries if e.reason)} of {len(exps.entries)} entries have a reason")
    for line in missing:
        print(f"no rule explains {line}")


@dataclass
class PageRequest:
    """What regenerating the page reads and writes (`root`: the project's checkout)."""

    root: Path
    store: Path
    notes: Path
    expectations: Path
    output: Path
    presets: list[str]
    coverage_presets: list[str]
    before: Path | None = None
    jobs: int = 2
    run: bool = False
    run_coverage: bool = False
    coverage_only: bool = False
    hand_written: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.hand_written = sorted(str(p.relative_to(self.root)) for p in (self.root / "suites").glob("*.yaml"))


def _check(req: PageRequest, presets: list[str], suites: list[str], repeats: int = 3,
           extra: tuple[str, ...] = ()) -> None:
    print(f"== checking {', '.join(presets)} on {', '.join(suites)}", flush=True)
    cmd = [sys.executable, str(req.root / "cli.py"), "--store", str(req.store), "check", *suites,
           *(a for p in presets for a in ("-b", p)), "-j", str(req.jobs), "--repeats", str(repeats),
           "--fail-on", "CRASH", *extra]
    for preset, value in VERDICTS_ONLY.items():
        if preset in presets:
            cmd += ["--preset-options", f"{preset}={value}"]
    subprocess.run(cmd, cwd=req.root, check=False)


def run_coverage(req: PageRequest) -> None:
    """suites/opinfo (every sample) and suites/zoo, one preset at a time, each run making
    the expectations file agree with what it found; then the new entries get their reasons
    from the notes."""
    runs = req.store / "runs"
    before = set(runs.glob("*.jsonl"))
    for preset in req.coverage_presets:
        _check(req, [preset], ["suites/opinfo", "suites/zoo"], repeats=1,
               extra=("--expectations", str(req.expectations), "--update-expectations"))
    new = sorted(set(runs.glob("*.jsonl")) - before)
    if new:
        fill_reasons_from_runs(req.expectations, req.notes, new)


def regenerate(req: PageRequest) -> int:
    """Check first where asked, then write the page (or only its OpInfo and zoo section);
    returns the exit status: 1 where a non-PASS or a known failure has no explanation."""
    if req.run:
        for preset in req.presets:   # the hand-written suites, one preset at a time
            _check(req, [preset], req.hand_written)
    if req.run_coverage:
        run_coverage(req)
    exps = load_known(req.expectations)
    blaming_the_test(exps, req.expectations)
    known = coverage_known(exps, req.coverage_presets, [req.root / "suites" / "opinfo", req.root / "suites" / "zoo"])
    coverage, unreasoned = coverage_lines(known, req.coverage_presets)
    if req.coverage_only:
        write_coverage(req.output, coverage)
        print(f"wrote the OpInfo and zoo section of {req.output}; {unreasoned} known failures without a reason")
        return 1 if unreasoned else 0
    with connect(req.store, warn=False) as a:   # one reading of the history for the page
        results, checked, made = latest_results(a, req.presets), checked_on(a), made_with(a)
    before = req.before.read_text() if req.before else None
    unexplained = write_page(results, load_rules(req.notes), req.presets, req.output, before, coverage,
                             made, checked, known_hand_written(exps, req.presets))
    write_heatmap(req.store, [p for p in req.presets if not p.startswith("coreml_")],
                  req.output.parent / "img" / "results-heatmap.png")
    print(f"wrote {req.output}; {unexplained} non-PASS results without an explanation, "
          f"{unreasoned} known OpInfo and zoo failures without a reason")
    return 1 if unexplained or unreasoned else 0
