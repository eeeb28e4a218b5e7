"""Every suite snippet in the docs validates: a user copying one gets a working suite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from opdiff_snap import api

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)


def _snippets() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 2
            out.append((f"{page.relative_to(ROOT)}:{line}", m.group(1)))
    return out


SNIPPETS = _snippets()


def test_the_docs_have_suite_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("where,text", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_a_suite_snippet_validates(where, text, tmp_path):
    data = yaml.safe_load(text)
    if isinstance(data, list):            # a list of tests, as a suite's `tests:` holds them
        text = "tests:\n" + "".join(f"  {line}\n" for line in text.splitlines())
    suite = tmp_path / "suite.yaml"
    suite.write_text(text)
    if isinstance(data, dict):
        includes = data.get("include") or []
        for name in [includes] if isinstance(includes, str) else includes:
            (tmp_path / name).write_text("dims: {}\n")     # a definitions file it may include
    api.validate([suite])
