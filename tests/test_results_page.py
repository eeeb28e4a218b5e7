"""tools/results_page.py keeps the hand-written blocks of the page it regenerates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "results_page.py"


def _tool():
    spec = importlib.util.spec_from_file_location("results_page", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_page_keeps_marked_blocks(tmp_path):
    tool = _tool()
    page = tmp_path / "results.md"
    block = "<!-- kept: localize -->\n## Where inside the models\n\nfindings\n<!-- end kept: localize -->"
    page.write_text(f"# old page\n\n## some_preset\n\nold rows\n\n{block}\n")
    tool.write_page({("t", "p"): ("MISMATCH", "m", None)}, [], ["p"], page)
    text = page.read_text()
    assert "old rows" not in text and "## p" in text    # regenerated...
    assert text.rstrip().endswith(block)                # ...with the block kept, at the end, once
    tool.write_page({("t", "p"): ("PASS", "", None)}, [], ["p"], page)
    assert page.read_text().count("<!-- kept: localize -->") == 1
