"""What the commands that read the history ask of it, from a command's settings: the store
opened under the settings' query limits, its warnings (lines skipped) passed to `warn`,
then a query, the schema, a report, a diff, the regressions, a site or an HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..core.config import Settings
from .sandbox import Limits, stopped_on_interrupt
from .views import connect

Warn = Callable[[str], None] | None


def history(settings: Settings | None, warn: Warn):
    """The history of `settings.store`, its SQL under the settings' query limits."""
    settings = settings or Settings()
    a = connect(settings.store, warn=False, limits=Limits.of(settings))
    for w in a.warnings:
        if warn is not None:
            warn(w)
    return a


def query(sql: str, settings: Settings | None = None, warn: Warn = None):
    """Read-only, sandboxed SQL over the history (views `runs` and `results`) -> Table.
    Ctrl-C anywhere from opening the history to the end of the statement: the query stopped."""
    with stopped_on_interrupt(), history(settings, warn) as a:
        return a.query(sql)


def schema(settings: Settings | None = None, warn: Warn = None) -> list:
    """(view, column, type, meaning) for every column of `runs` and `results`."""
    with history(settings, warn) as a:
        return a.schema()


def support(settings: Settings | None = None, by: str | None = None, warn: Warn = None):
    """Tests x presets, the latest verdict of each (columns per library version with `by`)."""
    from .reports import support_matrix

    with history(settings, warn) as a:
        return support_matrix(a, by=by)


def latency(settings: Settings | None = None, baseline: str | None = None, warn: Warn = None):
    """analytics.reports.LatencyReport: per preset, the latency ratio to the baseline and its trend."""
    from .reports import latency_report

    with history(settings, warn) as a:
        return latency_report(a, baseline)


def diff_runs(a_run: str | None = None, b_run: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, settings: Settings | None = None, warn: Warn = None):
    """analytics.reports.RunDiff from run A to run B (or the latest runs on two versions of `by`)."""
    from .reports import diff_runs as compute

    with history(settings, warn) as a:
        return compute(a, a_run, b_run, by=by, versions=versions, drift_factor=drift_factor,
                       latency_threshold=latency_threshold)


def regressions(flt=None, params=None, settings: Settings | None = None, warn: Warn = None):
    """Steps in latency, status changes and error growth over the whole history, each at the
    environment change it happened at: a list of analytics.findings.Finding (analytics/steps.py)."""
    from .steps import HistoryFilter, StepParams, detect

    with history(settings, warn) as a:
        return detect(a, flt or HistoryFilter(), params or StepParams())


def site(output: Path, flt=None, settings: Settings | None = None, warn: Warn = None) -> Path:
    """The history as a static folder of HTML (analytics/site.py); returns its index.html."""
    from .site import render_site
    from .steps import HistoryFilter

    with history(settings, warn) as a:
        return render_site(a, output, flt or HistoryFilter())


def html_report(output: Path, settings: Settings | None = None) -> Path:
    """One self-contained HTML file over the history; returns its path."""
    from .html import render_html

    with history(settings, None) as a:
        return render_html(a, output)


def diff_page(output: Path, a_run: str | None = None, b_run: str | None = None, *, by: str | None = None,
              versions: tuple[str, str] | None = None, drift_factor: float = 10.0,
              latency_threshold: float = 0.25, settings: Settings | None = None, warn: Warn = None) -> Path:
    """diff_runs(A, B) (or the latest runs on two versions of `by`) as one self-contained HTML
    page with the latency ratio per op family; returns its path."""
    diff = diff_runs(a_run, b_run, by=by, versions=versions, drift_factor=drift_factor,
                     latency_threshold=latency_threshold, settings=settings, warn=warn)
    return write_diff_page(diff, output)


def write_diff_page(diff, output: Path) -> Path:
    """An analytics.reports.RunDiff (from diff_runs or upgrade) as one self-contained HTML page."""
    from .diff_html import render_diff_html

    return render_diff_html(diff, output)

