"""Plots and the self-contained HTML report, and a look at it in headless Chromium."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections import Counter

import pytest
from test_analytics_reports import build_history

from opdiff_snap.analytics import connect
from opdiff_snap.analytics.html import render_html
from opdiff_snap.analytics.plots import family, latency_cdf, latency_trend_plot, support_heatmap
from opdiff_snap.analytics.reports import latency_report, support_matrix
from opdiff_snap.analytics.table import Table

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(p):
    return p.read_bytes()[:8] == PNG and p.stat().st_size > 2000


@pytest.mark.slow
def test_plots_write_pngs(tmp_path):
    build_history(tmp_path)
    with connect(tmp_path) as a:
        m, lat = support_matrix(a), latency_report(a)
    assert _is_png(support_heatmap(m, tmp_path / "h.png"))
    assert _is_png(latency_cdf(lat, tmp_path / "c.png"))
    assert _is_png(latency_trend_plot(lat.trend, tmp_path / "t.png"))


def test_heatmap_of_many_tests_groups_by_family(tmp_path):
    rows = [(f"op{i % 40}__case{i}", "PASS" if i % 7 else "MISMATCH", None) for i in range(250)]
    m = Table(["test_id", "onnx_cpu_fp32", "coreml_any_fp16"], rows)
    assert family("op3__case3") == "op3" and family("conv2d_3") == "conv2d"
    assert _is_png(support_heatmap(m, tmp_path / "big.png"))


def _report(tmp_path):
    build_history(tmp_path)
    out = render_html(tmp_path, tmp_path / "out" / "report.html")
    return out, out.read_text()


def test_html_report_is_self_contained(tmp_path):
    out, text = _report(tmp_path)
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(imgs) == 3 and all(base64.b64decode(i)[:8] == PNG for i in imgs)
    assert not re.search(r'(src|href)="(http|file|/)', text)      # nothing fetched
    # the support matrix row for mul and the latency row for onnx, as computed by hand
    assert ('<tr><td>mul</td><td class="good">PASS</td><td class="compare">MISMATCH</td>'
            '<td class="good">PASS</td></tr>') in text
    assert "<tr><td>onnx_cpu_fp32</td><td>4</td><td>0.75</td>" in text
    assert "r1 -&gt; r2: 1 newly failing, 1 newly passing, 2 drifted" in text
    assert "r3.jsonl:4: truncated or corrupt JSON line skipped" in text


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
# CI installs Chromium (.ci/run) and sets this: there, a missing browser is a failure
BROWSER_REQUIRED = os.environ.get("OPDIFF_REQUIRE_BROWSER") == "1"


@pytest.mark.slow
def test_html_report_renders_in_chromium(tmp_path):
    if CHROMIUM is None:
        if BROWSER_REQUIRED:
            pytest.fail("chromium is not installed, and this run requires it (OPDIFF_REQUIRE_BROWSER=1)")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it")
    out, _ = _report(tmp_path)
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", out.resolve().as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    # the browser parsed the page: the three plots and the hand-computed matrix row are in its DOM
    assert dom.count('src="data:image/png;base64,') == 3
    assert '<tr><td>mul</td><td class="good">PASS</td><td class="compare">MISMATCH</td>' in dom
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={shot}", "--window-size=1200,3000", out.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    from PIL import Image

    pixels = Counter(Image.open(shot).convert("RGB").get_flattened_data())
    # the stylesheet was applied (the matrix cells have their colours) and the embedded
    # heatmap was decoded and drawn (its PASS colour fills whole cells)
    assert pixels[(0xD7, 0xF0, 0xD9)] > 2000, "no green table cells were painted"
    assert pixels[(0xFB, 0xE3, 0xBF)] > 500, "no mismatch table cells were painted"
    assert pixels[(0x3A, 0x9D, 0x4A)] > 5000, "the support heatmap image was not drawn"
