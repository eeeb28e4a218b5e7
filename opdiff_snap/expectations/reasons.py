"""Why a result does not pass, as rules: the notes file (docs/results-notes.yaml) that
explains every non-PASS of the results page, and the reasons of an expectations file's
entries filled from it.

A rule names presets, tests and a status (globs), optionally a regex on the error
message, its kind and why; the first rule that matches a result explains it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import OpdiffError
from ..suite.dynamic import unsized_id
from .entries import Expectations

UNTRIAGED = "not triaged yet"   # the reason an entry no rule explains gets meanwhile (--untriaged)
KINDS = {"backend-limit": "backend limit", "tolerance": "tolerance choice",
         "upstream-bug": "bug worth reporting upstream", "platform": "platform (cannot run here)",
         "not-applicable": "not applicable (not run, by design)"}
# Not a kind a known failure may have: it would blame the test. A test whose result cannot
# mean anything on a target gets other inputs, or its result says so (not a failure).
TEST_DESIGN = ("test-design", "test design")
FIELDS = {"preset", "test", "status", "match", "kind", "why"}


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
        if r.get("kind") == TEST_DESIGN[0]:
            raise OpdiffError(f"{path}: rule {i} ({r.get('test', '*')} on {r.get('preset', '*')}): kind "
                              f"{TEST_DESIGN[0]} blames the test, which no known failure may do; give the test "
                              f"inputs whose result means something on the target, or name the backend limit, "
                              f"upstream bug or tolerance choice it is (kind in {sorted(KINDS)})")
        unknown = set(r) - FIELDS
        if unknown or r.get("kind") not in KINDS or not r.get("why"):
            raise OpdiffError(f"{path}: rule {i}: needs kind in {sorted(KINDS)} and why; unknown keys {unknown}")
        tests = r.get("test", "*")
        rules.append(Rule(r.get("preset", "*"), [tests] if isinstance(tests, str) else list(tests),
                          r.get("status", "*"), r.get("match", ""), r["kind"], r["why"]))
    return rules


def blaming_the_test(exps: Expectations, where: Path) -> None:
    """Raises naming every entry of `exps` (read from `where`) whose reason is of kind test
    design: a known failure describes a backend or a tolerance choice, never the test."""
    blamed = [f"{e.preset}: {e.test}" for e in exps.entries if e.reason.startswith(f"{TEST_DESIGN[1]}:")]
    if blamed:
        listed = ", ".join(blamed[:10]) + (f" and {len(blamed) - 10} more" if len(blamed) > 10 else "")
        raise OpdiffError(f"{where}: {len(blamed)} known failures give the reason kind '{TEST_DESIGN[1]}', which "
                          f"blames the test ({listed}); give such a test inputs whose result means something on "
                          "the target and record its golden again, or write the backend limit, upstream bug or "
                          "tolerance choice it really is")


def first_rule(rules: list[Rule], preset: str, test: str, status: str, message: str) -> Rule | None:
    return next((r for r in rules if r.explains(preset, test, status, message)), None)


def explained(reason: str) -> bool:
    return bool(reason) and not reason.startswith(UNTRIAGED)


def by_rule(reason: str) -> bool:
    """Whether a rule wrote `reason` (it opens with a kind: 'backend limit: ...')."""
    return any(reason.startswith(f"{kind}: ") for kind in KINDS.values())


def clip(text: str, at: int = 200) -> str:
    """At most `at` characters, cut at a word with "..." where it is longer."""
    return text if len(text) <= at else text[:text.rfind(" ", 0, at - 3)].rstrip(",;:") + "..."


def fill_reasons(exps: Expectations, rules: list[Rule], items: Iterable[Mapping[str, Any]],
                 refresh: bool = False, untriaged: bool = False) -> list[str]:
    """Give the entries of `exps` that `items` (run file items; the latest of each preset and
    test wins) describe the reason of the first rule that explains them. A reason already
    written is kept (with `refresh`: unless a rule wrote it); an entry no rule explains is
    returned as a line, and with `untriaged` gets "not triaged yet: " and the head of its
    message meanwhile."""
    found = {(item["preset"], item["id"]): item for item in items}
    filled, missing = [], []
    for e in exps.entries:
        item = found.get((e.preset, e.test))
        if item is None or (explained(e.reason) and not (refresh and by_rule(e.reason))):
            filled.append(e)
            continue
        message = item.get("error_message") or ""
        rule = first_rule(rules, e.preset, e.test, item["status"], message)
        if rule is None:
            missing.append(f"{e.preset}: {e.test} {item['status']}")
            head = " ".join(message.split())[:120]
            filled.append(dataclasses.replace(e, reason=f"{UNTRIAGED}: {head}") if untriaged and head else e)
            continue
        why = re.split(r"(?<=[.;:])\s", rule.why.strip())[0].rstrip(".;:")   # its first clause
        filled.append(dataclasses.replace(e, reason=clip(f"{KINDS[rule.kind]}: {why}")))
    exps.entries = filled
    return missing
