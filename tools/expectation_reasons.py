"""Fill the empty reasons of expectations.yaml from docs/results-notes.yaml, the rules that
explain every non-PASS of docs/results.md, matched against the results of check runs.

    for p in onnx_cpu_fp16 executorch_cpu_fp32; do
        opdiff --store /tmp/s check -b $p suites/*.yaml --update-expectations
    done
    python tools/expectation_reasons.py /tmp/s/runs/*.jsonl

A reason already written is kept (--refresh: unless a rule wrote it, for after the rules
changed); an entry no rule explains is listed, to be written by
hand (with --untriaged it gets "not triaged yet: " and the head of its message meanwhile;
such a reason is replaced once a rule explains the entry).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from results_page import KINDS, UNTRIAGED, explained, load_rules  # noqa: E402

from opdiff_snap import api  # noqa: E402
from opdiff_snap.expectations.file import dump  # noqa: E402
from opdiff_snap.history.runs import read_run  # noqa: E402


def _by_rule(reason: str) -> bool:
    return any(reason.startswith(f"{kind}: ") for kind in KINDS.values())


def clip(text: str, at: int = 200) -> str:
    """At most `at` characters, cut at a word with "..." where it is longer."""
    return text if len(text) <= at else text[:text.rfind(" ", 0, at - 3)].rstrip(",;:") + "..."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run files whose results the entries describe")
    ap.add_argument("--expectations", type=Path, default=ROOT / "expectations.yaml")
    ap.add_argument("--notes", type=Path, default=ROOT / "docs" / "results-notes.yaml")
    ap.add_argument("--refresh", action="store_true",
                    help="derive again the reasons a rule wrote (they open with a kind: 'backend limit: ...') "
                         "of the entries the runs name, after the rules changed; reasons written by hand are kept")
    ap.add_argument("--untriaged", action="store_true",
                    help="give an entry no rule explains the reason 'not triaged yet: <its message's first words>'")
    args = ap.parse_args()
    rules = load_rules(args.notes)
    found: dict[tuple[str, str], dict] = {}
    for path in args.runs:   # the latest result of each (preset, test) wins
        for item in read_run(path).items:
            found[(item["preset"], item["id"])] = item
    exps = api.load_expectations(args.expectations)
    assert exps is not None, f"no expectations file at {args.expectations}"
    filled, missing = [], []
    for e in exps.entries:
        item = found.get((e.preset, e.test))
        if item is None or (explained(e.reason) and not (args.refresh and _by_rule(e.reason))):
            filled.append(e)
            continue
        rule = next((r for r in rules if r.explains(e.preset, e.test, item["status"], item.get("error_message") or "")),
                    None)
        if rule is None:
            missing.append(f"{e.preset}: {e.test} {item['status']}")
            head = " ".join((item.get("error_message") or "").split())[:120]
            filled.append(dataclasses.replace(e, reason=f"{UNTRIAGED}: {head}") if args.untriaged and head else e)
            continue
        why = re.split(r"(?<=[.;:])\s", rule.why.strip())[0].rstrip(".;:")   # its first clause
        filled.append(dataclasses.replace(e, reason=clip(f"{KINDS[rule.kind]}: {why}")))
    exps.entries = filled
    args.expectations.write_text(dump(exps))
    print(f"{sum(1 for e in filled if e.reason)} of {len(filled)} entries have a reason")
    for line in missing:
        print(f"no rule explains {line}")


if __name__ == "__main__":
    main()
