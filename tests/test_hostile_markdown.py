"""Markdown written from hostile text: a check's summary (`--summary-md`, GitHub's step
summary) and the results page.

Test ids (validation accepts backticks, HTML and image syntax in them), reasons and
`until`s from the expectations file, its path, the history's path and the backends'
messages land in code spans and table cells. Rendered as GitHub does (CommonMark with
tables and raw HTML), none of them opens a tag, an image or a link, ends its cell or row,
or closes its code span: each shows as itself."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from opdiff_snap.analytics.coverage_section import coverage_lines
from opdiff_snap.analytics.shipped_results import Latest, write_page
from opdiff_snap.cli.summary_md import markdown
from opdiff_snap.compare.results import Result, RunReport
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.expectations.entries import Expectation
from opdiff_snap.expectations.known import Known
from opdiff_snap.expectations.reasons import Rule
from opdiff_snap.expectations.standing import Judged, Standing, StandingReport

HOSTILE = ("a``b<b>x</b><svg onload=alert(1)>![i](http://e.example/x.png)|c</details><script>alert(1)</script>"
           "[l](javascript:alert(1)) &amp; *em* ~~s~~ \\| ```\nnext line`")
FLAT = " ".join(HOSTILE.split())
OURS = {"h1", "h2", "h3", "h4", "p", "table", "thead", "tbody", "tr", "th", "td", "code", "details", "summary",
        "strong", "ul", "li"}


class _Page(HTMLParser):
    """The tags of rendered HTML, the cells of each table row, and the text of each <code>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list]] = []
        self.ends: list[str] = []
        self.rows: list[int] = []
        self.codes: list[str] = []
        self._code: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag):
        self.ends.append(tag)
        if tag == "code" and self._code is not None:
            self.codes.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        if self._code is not None:
            self._code.append(data)


def rendered(text: str) -> _Page:
    page = _Page()
    page.feed(MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text))
    return page


def assert_inert(text: str, widths: set[int], images: tuple[str, ...] = ()) -> _Page:
    """Only our own tags (and images of ours, from `images`), no other attribute (no link),
    every table row as wide as its table's header (one of `widths`), and no line that starts
    outside a row or list where hostile text began."""
    page = rendered(text)
    ours = [(tag, attrs) for tag, attrs in page.tags if not (tag == "img" and dict(attrs).get("src") in images)]
    assert {tag for tag, _ in ours} <= OURS, {tag for tag, _ in ours} - OURS
    assert all(not attrs for tag, attrs in ours if tag != "td" and tag != "th"), ours
    assert set(page.rows) <= widths, page.rows
    assert not any(line.startswith("next line") for line in text.splitlines())
    return page


def _report():
    results = [Result(test_id=HOSTILE, seed=0, preset="torch_cpu_fp32", verdict=Verdict.MISMATCH, message=HOSTILE),
               Result(test_id=HOSTILE + "2", seed=1, preset="torch_cpu_fp32", verdict=Verdict.EXPORT_FAIL,
                      message=HOSTILE)]
    expectation = Expectation("torch_cpu_fp32", HOSTILE + "2", Verdict.EXPORT_FAIL, reason=HOSTILE, line=2)
    expired = Expectation("torch_cpu_fp32", HOSTILE, Verdict.CRASH, reason=HOSTILE, until=HOSTILE, line=3)
    standing = StandingReport([Judged(results[0], Standing.NEW), Judged(results[1], Standing.EXPECTED, expectation)],
                              [expired], path="exp`ect<script>|.yaml")
    return RunReport(run_id="r<b>1", path=Path("store/`x</details>.jsonl"), command="check", results=results,
                     wall_s=1.0), standing


@pytest.mark.parametrize("with_standing", [True, False])
def test_hostile_text_in_the_summary_stays_in_its_code_span_or_cell(with_standing):
    report, standing = _report()
    text = markdown(report, {Verdict.MISMATCH, Verdict.EXPORT_FAIL}, standing if with_standing else None)
    page = assert_inert(text, {3, 4, 6})
    assert FLAT in page.codes                        # the id, shown as it is
    assert "store/`x</details>.jsonl" in page.codes
    if with_standing:
        assert "exp`ect<script>|.yaml" in page.codes
        assert [t for t, _ in page.tags].count("details") == page.ends.count("details") == 1   # ours alone


def test_hostile_text_on_the_results_page_stays_in_its_code_span_or_cell(tmp_path):
    page_file = tmp_path / "results.md"
    results = {(HOSTILE, "p"): Latest("MISMATCH", HOSTILE), ("t|x", "p"): Latest("EXPORT_FAIL", HOSTILE)}
    rules = [Rule("*", ["t*"], "EXPORT_FAIL", "", "backend-limit", HOSTILE)]
    known = [Known("zoo", HOSTILE, "p", "MISMATCH", HOSTILE),
             Known("opinfo", "opinfo." + HOSTILE + ".f32.0", "p", "EXPORT_FAIL", "backend limit: " + HOSTILE)]
    coverage, _ = coverage_lines(known, ["p"])
    write_page(results, rules, ["p"], page_file, coverage=coverage)
    page = assert_inert(page_file.read_text(), {2, 3, 4, 5, 6}, images=("img/results-heatmap.png",))
    assert FLAT in page.codes and "t|x" in page.codes
