"""PNG pictures of the reports (matplotlib, Agg backend): support heatmap, latency-ratio
CDF, per-preset latency trend."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from ..core.safetext import printable
from ..core.verdicts import COMPARISON, OPDIFF_OK, PASSING, Verdict
from ..core.verdicts import QUIET as QUIET_VERDICTS
from .reports import LatencyReport
from .table import Table

MAX_ROWS = 60      # above this many tests the heatmap shows op families instead
GOOD = {v.value for v in PASSING} | {OPDIFF_OK}
QUIET = {v.value for v in QUIET_VERDICTS}
COMPARE = {v.value for v in COMPARISON}
# verdict class -> (code, color, label)
CLASSES = [("none", "#ffffff", "not run"), ("good", "#3a9d4a", Verdict.PASS.value),
           ("quiet", "#b8b8b8", "skipped / unavailable"), ("compare", "#f0a030", "mismatch"),
           ("fail", "#d03a30", "export/load/infer fail, crash, ...")]


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _label(value: object) -> str:
    """Text from the history for a plot: control characters escaped, and `$` literal
    (matplotlib would read text between two of them as math, and fail on what it cannot parse)."""
    return printable(value).replace("$", r"\$")


def verdict_class(v: str | None) -> int:
    if v is None:
        return 0
    if v in GOOD:
        return 1
    if v in QUIET:
        return 2
    if v in COMPARE:
        return 3
    return 4


def family(test_id: str) -> str:
    """The op family of a test id: its part before '__', '.', '[' or a trailing _<digits>."""
    head = re.split(r"__|\.|\[", test_id)[0]
    return re.sub(r"_\d+$", "", head) or test_id


def support_heatmap(matrix: Table, path: str | Path, title: str = "Support matrix") -> Path:
    """Tests x presets colored by verdict class; with more than MAX_ROWS tests, one row per op
    family colored by its pass fraction and labelled passed/total."""
    plt = _plt()
    from matplotlib.colors import ListedColormap
    presets = matrix.columns[1:]
    path = Path(path)
    if len(matrix.rows) <= MAX_ROWS:
        labels = [_label(r[0]) for r in matrix.rows]
        grid: list[list[float]] = [[verdict_class(v) for v in r[1:]] for r in matrix.rows]
        fig, ax = plt.subplots(figsize=(2 + 1.1 * max(len(presets), 2), 1.5 + 0.28 * max(len(labels), 3)))
        if grid:
            ax.imshow(grid, cmap=ListedColormap([c for _, c, _ in CLASSES]), vmin=0, vmax=4,
                      aspect="auto", interpolation="nearest")
        for i, r in enumerate(matrix.rows):
            for j, v in enumerate(r[1:]):
                if v and v not in GOOD:
                    ax.text(j, i, _label(v[:12]), ha="center", va="center", fontsize=6, color="black")
        from matplotlib.patches import Patch
        ax.legend(handles=[Patch(facecolor=c, edgecolor="#888", label=name) for _, c, name in CLASSES],
                  loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    else:
        fam: dict[str, list[list[int]]] = defaultdict(lambda: [[0, 0] for _ in presets])
        for r in matrix.rows:
            for j, v in enumerate(r[1:]):
                if v is not None:
                    cell = fam[family(r[0])][j]
                    cell[0] += v in GOOD
                    cell[1] += 1
        order = sorted(fam, key=lambda f: (sum(p for p, _ in fam[f]) / max(1, sum(n for _, n in fam[f])), f))
        hidden = 0
        if len(order) > MAX_ROWS:   # show the worst families; the rest are summarized
            hidden, order = len(order) - MAX_ROWS, order[:MAX_ROWS]
        labels = [_label(f"{f} ({sum(1 for r in matrix.rows if family(r[0]) == f)})") for f in order]
        grid = [[(p / n if n else float("nan")) for p, n in fam[f]] for f in order]
        fig, ax = plt.subplots(figsize=(2 + 1.1 * max(len(presets), 2), 1.5 + 0.28 * len(labels)))
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        for i, f in enumerate(order):
            for j, (p, n) in enumerate(fam[f]):
                if n:
                    ax.text(j, i, f"{p}/{n}", ha="center", va="center", fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.04, label="fraction passing")
        if hidden:
            title += f" (worst {MAX_ROWS} of {MAX_ROWS + hidden} op families)"
        else:
            title += f" ({len(matrix.rows)} tests by op family)"
    ax.set_xticks(range(len(presets)), [_label(p) for p in presets], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def latency_cdf(report: LatencyReport, path: str | Path) -> Path:
    """Empirical CDF of infer_ms ratio (preset / baseline) per preset, log x."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for preset in sorted(report.samples):
        xs = sorted(report.samples[preset])
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                label=_label(f"{preset} (n={len(xs)})"))
    ax.axvline(1.0, color="#666", linestyle="--", linewidth=0.8)
    if report.samples:
        ax.set_xscale("log")
        ax.legend(fontsize=8, frameon=False)
    else:
        ax.text(0.5, 0.5, "no timings to compare", ha="center", transform=ax.transAxes)
    ax.set_xlabel(f"infer_ms / {_label(report.baseline)} infer_ms  (<1 faster)")
    ax.set_ylabel("fraction of tests")
    ax.set_title("Latency ratio against the baseline", fontsize=10)
    ax.grid(True, linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def latency_trend_plot(trend: Table, path: str | Path) -> Path:
    """Median infer_ms per preset across runs (x: runs in start order)."""
    plt = _plt()
    runs: list[str] = []
    for r in trend.dicts():
        if r["run_id"] not in runs:
            runs.append(r["run_id"])
    pos = {r: i for i, r in enumerate(runs)}
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in trend.dicts():
        series[r["preset"]].append((pos[r["run_id"]], r["median_infer_ms"]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for preset in sorted(series):
        xs, ys = zip(*series[preset])
        ax.plot(xs, ys, marker="o", markersize=3, label=_label(preset))
    step = max(1, len(runs) // 12)
    ax.set_xticks(range(0, len(runs), step), [_label(runs[i][:15]) for i in range(0, len(runs), step)],
                  rotation=35, ha="right", fontsize=7)
    if series:
        ax.set_yscale("log")
        ax.legend(fontsize=8, frameon=False)
    ax.set_ylabel("median infer_ms")
    ax.set_title("Latency per preset across runs", fontsize=10)
    ax.grid(True, linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def family_ratios(ratios: Table) -> dict[str, list[float]]:
    """op family -> latency ratios (b / a) of its tests, from RunDiff.ratios."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in ratios.dicts():
        if r["ratio"] and r["ratio"] > 0:
            out[family(r["test_id"])].append(float(r["ratio"]))
    return dict(out)


def latency_by_family(ratios: Table, path: str | Path, label_a: str = "A", label_b: str = "B") -> Path:
    """One row per op family: its tests' latency ratios B / A (dots), their median (bar),
    log x; the families furthest from 1 first when there are more than MAX_ROWS."""
    import math
    import statistics

    plt = _plt()
    fam = family_ratios(ratios)
    med = {f: statistics.median(xs) for f, xs in fam.items()}
    order = sorted(fam, key=lambda f: -abs(math.log(med[f])))[:MAX_ROWS]
    order.sort(key=lambda f: med[f])
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.24 * max(len(order), 3)))
    for i, f in enumerate(order):
        xs = fam[f]
        ax.scatter(xs, [i] * len(xs), s=9, alpha=0.55, color="#4a7fb0", linewidths=0)
        colour = "#d03a30" if med[f] > 1 else "#3a9d4a" if med[f] < 1 else "#666666"
        ax.plot([med[f]] * 2, [i - 0.38, i + 0.38], color=colour, linewidth=3, zorder=3)
    ax.axvline(1.0, color="#666", linestyle="--", linewidth=0.8)
    if order:
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.xaxis.set_major_formatter(plain)
        everything = [x for f in order for x in fam[f]]
        if max(everything) / min(everything) < 10:   # within a decade: label the minor ticks too
            ax.xaxis.set_minor_formatter(plain)
        ax.tick_params(axis="x", which="both", labelsize=7)
        ax.set_yticks(range(len(order)), [_label(f"{f} ({len(fam[f])})") for f in order], fontsize=7)
    else:
        ax.text(0.5, 0.5, "no test was timed in both runs", ha="center", transform=ax.transAxes)
        ax.set_yticks([])
    shown = f" (the {len(order)} of {len(fam)} families furthest from 1)" if len(fam) > len(order) else ""
    ax.set_xlabel(f"infer_ms ratio  {_label(label_b)} / {_label(label_a)}  (<1 faster, >1 slower; bar: median)",
                  fontsize=8)
    ax.set_title(f"Latency ratio per op family{shown}", fontsize=10)
    ax.grid(True, axis="x", linewidth=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)
