"""One self-contained HTML report: summary, support matrix, latency, recent regressions.
Pictures are embedded as base64 PNG data URIs; nothing is fetched when it opens."""

from __future__ import annotations

import base64
import datetime as dt
import html
import tempfile
from collections import Counter
from pathlib import Path

from ..core.safetext import printable
from . import plots
from .reports import _open, diff_runs, latency_report, support_matrix
from .table import Table, cell

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:left}th{background:#f4f4f4}
td.good{background:#d7f0d9}td.fail{background:#f7d0cc}td.compare{background:#fbe3bf}
td.quiet{background:#eee}.counts span{display:inline-block;margin-right:16px}
img{max-width:100%;border:1px solid #eee}.note{color:#666}
"""
_CLASS = {1: "good", 2: "quiet", 3: "compare", 4: "fail"}


def text(value: object) -> str:
    """Data (a test id, a message, a version from the history) as HTML text: control
    characters escaped visibly, then HTML-escaped."""
    return html.escape(printable(value))


def _img(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img alt="{text(alt)}" src="data:image/png;base64,{data}">'


def html_table(t: Table, verdicts: bool = False, max_rows: int = 400,
               verdict_columns: set[str] | None = None) -> str:
    """A Table as an HTML table; with `verdicts`, cells colored by verdict class (only those
    of `verdict_columns` when given)."""
    out = ["<table><tr>" + "".join(f"<th>{text(c)}</th>" for c in t.columns) + "</tr>"]
    colour = [verdicts and (verdict_columns is None or c in verdict_columns) for c in t.columns]
    for r in t.rows[:max_rows]:
        tds = []
        for v, want in zip(r, colour):
            cls = _CLASS.get(plots.verdict_class(v)) if want and isinstance(v, str) else None
            attr = f' class="{cls}"' if cls and v != r[0] else ""
            tds.append(f"<td{attr}>{text(cell(v))}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table>")
    if len(t.rows) > max_rows:
        out.append(f'<p class="note">{len(t.rows) - max_rows} more rows not shown; '
                   "`opdiff report support` prints them all.</p>")
    return "\n".join(out)


def render_html(store, out_path: str | Path, title: str = "opdiff-snap history report") -> Path:
    """Write the report to `out_path` and return it."""
    out_path = Path(out_path)
    with _open(store) as a, tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        matrix = support_matrix(a)
        lat = latency_report(a)
        runs = a.sql("""SELECT count(*), count(*) FILTER (WHERE complete),
                               min(started), max(started) FROM runs""").rows[0]
        n_results = a.sql("SELECT count(*) FROM results").rows[0][0]
        # the two latest complete logical runs: a run group (the shards of one check) counts once
        latest = a.sql("""SELECT coalesce(run_group, run_id) AS ref FROM runs
                          WHERE coalesce(command, 'check') = 'check'
                          GROUP BY ref HAVING bool_and(complete)
                          ORDER BY max(started) DESC NULLS LAST, ref DESC LIMIT 2""").rows
        recent = diff_runs(a, latest[1][0], latest[0][0]) if len(latest) == 2 else None
        versions = a.sql("""SELECT run_id, started, command, complete, torch, executorch,
                                   onnxruntime, coremltools, presets
                            FROM runs ORDER BY started DESC NULLS LAST LIMIT 15""")
        warnings = list(a.warnings)
        heat = plots.support_heatmap(matrix, tmpd / "heat.png")
        cdf = plots.latency_cdf(lat, tmpd / "cdf.png")
        trend = plots.latency_trend_plot(lat.trend, tmpd / "trend.png")
        imgs = {k: _img(p, k) for k, p in
                (("support heatmap", heat), ("latency ratio CDF", cdf), ("latency trend", trend))}

    verdicts = Counter(v for r in matrix.rows for v in r[1:] if v is not None)
    counts = "".join(f"<span><b>{text(k)}</b> {n}</span>" for k, n in sorted(verdicts.items()))
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{text(title)}</title>",
             f"<style>{CSS}</style></head><body><h1>{text(title)}</h1>",
             f"<p class='note'>generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC</p>",
             "<h2>Summary</h2>",
             f"<p>{runs[0]} runs ({runs[1]} complete) from {text(cell(runs[2]))} to {text(cell(runs[3]))}; "
             f"{n_results} results; {len(matrix.rows)} tests x {len(matrix.columns) - 1} presets.</p>",
             f"<p class='counts'>Latest verdicts: {counts or 'none'}</p>"]
    if warnings:
        parts.append("<p class='note'>Skipped lines:<br>" +
                     "<br>".join(text(w) for w in warnings[:20]) + "</p>")
    parts += ["<h2>Support matrix (latest verdict)</h2>", imgs["support heatmap"],
              html_table(matrix, verdicts=True),
              f"<h2>Latency against {text(lat.baseline)}</h2>", html_table(lat.ratios),
              imgs["latency ratio CDF"], imgs["latency trend"]]
    parts.append("<h2>Recent regressions</h2>")
    if recent is None:
        parts.append("<p class='note'>fewer than two complete check runs.</p>")
    else:
        parts.append(f"<p>{text(recent.summary())}</p>")
        for name, t in recent.sections():
            if t.rows:
                parts += [f"<h3>{text(name)}</h3>", html_table(t, verdicts=True)]
    parts += ["<h2>Recent runs</h2>", html_table(versions), "</body></html>"]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(parts), encoding="utf-8")
    return out_path
