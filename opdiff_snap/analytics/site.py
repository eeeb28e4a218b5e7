"""`opdiff report site`: the history as a static folder of HTML, as asv publishes its results.

    <out>/index.html          presets x environments (passed / total of the latest run in each),
                              the findings grouped by environment change, every test with a link
    <out>/tests/<name>.html   one page per test: its latency and status history across runs and
    <out>/tests/<name>.png    environments, environment changes and the detected steps marked

Relative links only; nothing is fetched when a page opens, and no server is needed.

The site is written into a fresh folder beside `<out>` and swapped in whole, so no page of
an earlier site survives and nothing is written through a link. An existing `<out>` is
replaced only when it is empty or holds a site (its `.opdiff-site` mark, or only the
files a site has), never when it is a link.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import OpdiffError
from . import plots
from .findings import REGRESSION, Finding, findings_table, group_by_change, groups_table
from .html import CSS, html_table, text
from .reports import _open
from .steps import HistoryFilter, StepParams, detect, filter_sql
from .table import Table, cell

LIBS = ("torch", "executorch", "onnxruntime", "coremltools")
MAX_SERIES = 8         # plots per test page (preset x seed x host); the rest are listed
SITE_CSS = CSS + """
td.part{background:#fbe3bf}th.env{font-weight:normal;font-size:11px}
.step-up{color:#d03a30}.step-down{color:#3a9d4a}
"""


@dataclass
class Point:
    run_id: str
    started: dt.datetime | None
    env: str
    infer_ms: float | None
    status: str | None


@dataclass
class TestHistory:
    test_id: str
    series: dict[tuple, list[Point]] = field(default_factory=dict)   # (preset, seed, host) -> points in order


def page_name(test_id: str) -> str:
    """A file name for a test id: its safe characters and a short hash (ids differing only in
    unsafe characters, or in case, stay apart)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", test_id)[:80].strip(".") or "test"
    return f"{safe}-{hashlib.sha256(test_id.encode()).hexdigest()[:8]}"


def _env_sql() -> str:
    return "concat_ws(chr(10), " + ", ".join(f"'{lib} ' || coalesce(runs.{lib}, '-')" for lib in LIBS) + ")"


MARK = ".opdiff-site"


def _replaceable(out: Path) -> None:
    """Refuse an `out` that is a link, a file, or a folder holding anything but a site."""
    if out.is_symlink():
        raise OpdiffError(f"report site: '{out}' is a symbolic link; the site is never written through a link. "
                          "Give -o a real folder (it is created when missing).")
    if not out.exists():
        return
    if not out.is_dir():
        raise OpdiffError(f"report site: '{out}' is a file; give -o a folder (it is created when missing).")
    entries = list(out.iterdir())
    if not entries or (out / MARK).is_file():
        return
    pages = out / "tests"
    ours = all(e.name in ("index.html", "tests") and not e.is_symlink() for e in entries) and (
        not pages.exists() or (pages.is_dir() and all(
            f.is_file() and not f.is_symlink() and f.suffix in (".html", ".png") for f in pages.iterdir())))
    if not ours:
        raise OpdiffError(f"report site: '{out}' holds files that are not a site written by `opdiff report "
                          "site`; the site replaces its folder whole, so nothing was written. Give -o a new or "
                          "empty folder, or one an earlier `opdiff report site` wrote.")


def _swap_in(fresh: Path, out: Path) -> None:
    """Put the folder `fresh` where `out` is, the old one removed only once the new one is there."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / "site")
    os.replace(fresh, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def render_site(store, out_dir: str | Path, flt: HistoryFilter = HistoryFilter(),
                params: StepParams = StepParams()) -> Path:
    """Write the site into `out_dir` (see the module docstring) and return its index.html."""
    target = Path(out_dir).absolute()
    _replaceable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    try:
        _render(store, fresh, flt, params)
        (fresh / MARK).write_text("written by `opdiff report site`; replaced whole by the next one\n")
        fresh.chmod(0o755)
        _replaceable(target)   # still true now that the work is done
        _swap_in(fresh, target)
    finally:
        if fresh.exists():
            shutil.rmtree(fresh, ignore_errors=True)
    return target / "index.html"


def _render(store, out: Path, flt: HistoryFilter, params: StepParams) -> None:
    (out / "tests").mkdir()
    sql = filter_sql(flt)
    where = f"coalesce(runs.command, 'check') = 'check' AND r.test_id IS NOT NULL AND r.preset IS NOT NULL " \
            f"AND {sql.on_runs} AND {sql.on_results}"
    args = sql.args
    with _open(store) as a:
        findings = detect(a, flt, params)
        cells = a.sql(f"""
            WITH x AS (SELECT r.preset, {_env_sql()} AS env, r.run_id, runs.started, r.status
                       FROM results r JOIN runs USING (run_id) WHERE {where}),
                 latest AS (SELECT preset, env, arg_max(run_id, started) AS run_id, min(started) AS first
                            FROM x GROUP BY ALL)
            SELECT x.preset, x.env, any_value(latest.first) AS first,
                   count(*) FILTER (WHERE verdict_passing(x.status)) AS passed,
                   count(*) FILTER (WHERE NOT verdict_not_run(x.status)) AS ran, count(*) AS total
            FROM x JOIN latest USING (preset, env, run_id) GROUP BY ALL""", args)
        rows = a.sql(f"""
            SELECT r.test_id, r.preset, r.seed, runs.host, r.run_id, runs.started, {_env_sql()} AS env,
                   r.infer_ms, r.status
            FROM results r JOIN runs USING (run_id) WHERE {where}
            ORDER BY r.test_id, r.preset, r.seed NULLS FIRST, runs.host NULLS FIRST, runs.started, r.run_id""", args)
    tests: dict[str, TestHistory] = {}
    for test_id, preset, seed, host, run_id, started, env, ms, status in rows.rows:
        h = tests.setdefault(test_id, TestHistory(test_id))
        h.series.setdefault((preset, seed, host), []).append(Point(run_id, started, env, ms, status))
    by_test: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_test[f.test_id].append(f)
    for h in tests.values():
        _test_page(out / "tests", h, by_test.get(h.test_id, []))
    (out / "index.html").write_text(_index(cells, findings, tests, by_test), encoding="utf-8")


def _head(title: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{text(title)}</title>"
            f"<style>{SITE_CSS}</style></head><body><h1>{text(title)}</h1>"
            f"<p class='note'>generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC</p>")


def _index(cells: Table, findings: list[Finding], tests: dict[str, TestHistory],
           by_test: dict[str, list[Finding]]) -> str:
    envs = sorted({(r[2], r[1]) for r in cells.rows}, key=lambda fe: (fe[0] or dt.datetime.min, fe[1]))
    order = [env for _, env in envs]
    grid: dict[str, dict[str, tuple[int, int, int]]] = defaultdict(dict)
    for preset, env, _, passed, ran, total in cells.rows:
        grid[preset][env] = (passed, ran, total)
    head = "<tr><th>preset</th>" + "".join(
        "<th class='env'>" + "<br>".join(text(line) for line in env.split("\n")) + "</th>" for env in order) + "</tr>"
    body = []
    for preset in sorted(grid):
        tds = []
        for env in order:
            if env not in grid[preset]:
                tds.append("<td></td>")
                continue
            passed, ran, total = grid[preset][env]
            cls = "good" if ran and passed == ran else "fail" if ran and not passed else "part" if ran else "quiet"
            tds.append(f"<td class='{cls}'>{passed}/{total}</td>")
        body.append(f"<tr><td>{text(preset)}</td>{''.join(tds)}</tr>")
    groups = group_by_change(findings)
    listing = []
    for test_id in sorted(tests):
        fs = by_test.get(test_id, [])
        mark = (f" <span class='step-up'>{sum(f.direction == REGRESSION for f in fs)} regressions</span>"
                if any(f.direction == REGRESSION for f in fs) else f" ({len(fs)} changes)" if fs else "")
        listing.append(f"<li><a href='tests/{page_name(test_id)}.html'>{text(test_id)}</a>{mark}</li>")
    regressions = sum(f.direction == REGRESSION for f in findings)
    return "\n".join([
        _head("opdiff-snap history"),
        f"<p>{len(tests)} tests, {len(order)} environments; {len(findings)} changes at environment changes, "
        f"{regressions} of them regressions (`opdiff regressions`).</p>",
        "<h2>Presets x environments</h2><p class='note'>passed / results in the latest check run of each "
        "environment.</p>", f"<table>{head}{''.join(body)}</table>",
        "<h2>Changes by environment change</h2>",
        html_table(groups_table(groups)) if groups else "<p class='note'>none found.</p>",
        "<h2>Tests</h2><ul>", *listing, "</ul></body></html>"])


def _test_page(folder: Path, h: TestHistory, findings: list[Finding]) -> None:
    name = page_name(h.test_id)
    keys = list(h.series)[:MAX_SERIES]
    img = ""
    if keys:
        _plot(folder / f"{name}.png", h, keys, findings)
        img = f"<img alt='latency and status history of {text(h.test_id)}' src='{name}.png'>"
    more = "" if len(h.series) <= MAX_SERIES else \
        f"<p class='note'>{len(h.series) - MAX_SERIES} more series not drawn.</p>"
    summary = []
    for (preset, seed, host), points in h.series.items():
        per_env: dict[str, list[Point]] = {}
        for p in points:
            per_env.setdefault(p.env, []).append(p)
        for env, ps in per_env.items():
            timed = sorted(p.infer_ms for p in ps if p.infer_ms)
            statuses = sorted({p.status or "" for p in ps})
            summary.append((preset, seed, host, env.replace("\n", ", "), len(ps),
                            timed[len(timed) // 2] if timed else None, " ".join(statuses)))
    table = Table(["preset", "seed", "host", "environment", "runs", "median_infer_ms", "statuses"], summary)
    page = [_head(h.test_id), "<p><a href='../index.html'>index</a></p>", img, more,
            "<h2>Changes at environment changes</h2>",
            html_table(findings_table(findings)) if findings else "<p class='note'>none found.</p>",
            "<h2>Per environment</h2>", html_table(table, verdicts=True, verdict_columns={"statuses"}),
            "</body></html>"]
    (folder / f"{name}.html").write_text("\n".join(page), encoding="utf-8")


def _plot(path: Path, h: TestHistory, keys: list[tuple], findings: list[Finding]) -> None:
    """One panel per series: infer_ms per run (log scale, coloured by verdict), environment
    changes as dashed lines, detected steps as solid lines with their ratio, status changes named."""
    plt = plots._plt()
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator, NullFormatter

    colours = {i: c for i, (_, c, _) in enumerate(plots.CLASSES)}
    fig, axes = plt.subplots(len(keys), 1, figsize=(9, 2.6 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys):
        points = h.series[key]
        index = {p.run_id: i for i, p in enumerate(points)}
        timed = [(i, p.infer_ms, plots.verdict_class(p.status)) for i, p in enumerate(points) if p.infer_ms]
        if timed:
            ax.scatter([t[0] for t in timed], [t[1] for t in timed], s=10,
                       c=[colours[t[2]] for t in timed], zorder=3)
            ax.set_yscale("log")
            # plain numbers: log axes label with mathtext by default, which costs seconds per figure
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
            ys = [t[1] for t in timed]
            within_a_decade = max(ys) / min(ys) < 10
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2g") if within_a_decade else NullFormatter())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("infer_ms", fontsize=8)
        for i, p in enumerate(points):
            if not p.infer_ms:   # no timing: the verdict as a tick along the bottom
                ax.axvline(i, ymax=0.06, color=colours[plots.verdict_class(p.status)], linewidth=2)
            if i and p.env != points[i - 1].env:
                ax.axvline(i - 0.5, color="#888888", linestyle="--", linewidth=0.8)
        preset, seed, host = key
        for f in findings:
            if (f.preset, f.seed, f.host) != (preset, seed, host) or f.run_id not in index:
                continue
            x = index[f.run_id] - 0.5
            up = f.direction == REGRESSION
            colour = "#d03a30" if up else "#3a9d4a"
            ax.axvline(x, color=colour, linewidth=2.5, zorder=2)
            label = (f"x{f.ratio:.2g}" if f.kind == "latency" and f.ratio else
                     f"max_abs {f.before} -> {f.after}" if f.kind == "metric" else f"{f.before} -> {f.after}")
            ax.annotate(plots._label(label), (x, 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                        color=colour, ha="left", va="top", xytext=(3, -2), textcoords="offset points")
        ax.set_title(plots._label(f"{preset}  seed {cell(seed)}  {cell(host)}"), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(True, linewidth=0.3)
    axes[-1, 0].set_xlabel("check runs in start order (dashed: environment change; solid: detected change)",
                           fontsize=8)
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 0.3 / (2.6 * len(keys)), bottom=0.5 / (2.6 * len(keys)),
                        hspace=0.45)
    fig.savefig(path, dpi=80)
    plt.close(fig)
