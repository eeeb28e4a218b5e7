"""The comparison of two runs (an upgrade: one library version against another) as one
self-contained HTML page: the environment difference first, then newly failing, newly
passing, drift and latency changes, and a plot of the latency ratio per op family. The
plot is embedded as a base64 PNG; nothing is fetched when the page opens."""

from __future__ import annotations

import datetime as dt
import math
import statistics
import tempfile
from pathlib import Path

from . import plots
from .html import CSS, _img, html_table, text
from .reports import RunDiff
from .table import Table


def family_table(diff: RunDiff) -> Table:
    """Per op family: tests timed in both runs, median and geometric-mean ratio, slower/faster
    counts (by the ratio alone; `latency changes` applies the noise threshold)."""
    rows = []
    for fam, xs in sorted(plots.family_ratios(diff.ratios).items()):
        geo = math.exp(sum(math.log(x) for x in xs) / len(xs))
        rows.append((fam, len(xs), round(statistics.median(xs), 3), round(geo, 3),
                     sum(x > 1 for x in xs), sum(x < 1 for x in xs)))
    rows.sort(key=lambda r: -abs(math.log(r[2])) if r[2] > 0 else 0)
    return Table(["family", "n", "median_ratio", "geomean_ratio", "slower", "faster"], rows)


def render_diff_html(diff: RunDiff, out_path: str | Path, title: str | None = None) -> Path:
    """Write the page for `diff` (analytics.reports.diff_runs) to `out_path` and return it."""
    out_path = Path(out_path)
    title = title or f"{diff.label_a} -> {diff.label_b}"
    with tempfile.TemporaryDirectory() as tmp:
        png = plots.latency_by_family(diff.ratios, Path(tmp) / "families.png", "A", "B")
        image = _img(png, "latency ratio per op family")
    ratios = [r[-1] for r in diff.ratios.rows if r[-1]]
    overall = ""
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        overall = (f"<p>Latency B / A over the {len(ratios)} results timed in both runs: median "
                   f"{statistics.median(ratios):.3f}, geometric mean {geo:.3f}.</p>")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{text(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{text(title)}</h1>",
             f"<p class='note'>generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; "
             f"A = {text(diff.label_a)}, B = {text(diff.label_b)}</p>",
             "<h2>Environment differences</h2>",
             html_table(diff.environment) if diff.environment.rows
             else "<p class='note'>none recorded (the same versions on the same machine).</p>",
             f"<h2>Summary</h2><p class='counts'>{text(diff.summary())}</p>", overall,
             "<h2>Latency ratio per op family</h2>", image, html_table(family_table(diff))]
    for name, t in diff.sections()[1:]:
        parts.append(f"<h2>{text(name)} ({len(t)})</h2>")
        parts.append(html_table(t, verdicts=True, verdict_columns={"status_a", "status_b"}) if t.rows
                     else "<p class='note'>none.</p>")
    parts.append("</body></html>")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(parts), encoding="utf-8")
    return out_path
