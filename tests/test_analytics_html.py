"""Plots and the self-contained HTML report, and a look at it in headless Chromium."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections import Counter

import pytest
from helpers.cli import MODULE, run
from helpers.history.synth import Res, Run, write_run
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


def require_chromium() -> None:
    """Skip without Chromium, unless this run requires it (CI)."""
    if CHROMIUM is None:
        if BROWSER_REQUIRED:
            pytest.fail("chromium is not installed, and this run requires it (OPDIFF_REQUIRE_BROWSER=1)")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it")


def dump_dom(page) -> str:
    """The DOM headless Chromium builds from `page`."""
    return subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", page.resolve().as_uri()],
                          check=True, capture_output=True, text=True, timeout=120).stdout


def painted(page, shot, size: str) -> Counter:
    """The colours of a screenshot of `page` in headless Chromium, window `size` ("W,H"), and how
    many pixels each."""
    subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={shot}", f"--window-size={size}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    from PIL import Image

    return Counter(Image.open(shot).convert("RGB").get_flattened_data())


@pytest.mark.slow
def test_html_report_renders_in_chromium(tmp_path):
    require_chromium()
    out, _ = _report(tmp_path)
    dom = dump_dom(out)
    # the browser parsed the page: the three plots and the hand-computed matrix row are in its DOM
    assert dom.count('src="data:image/png;base64,') == 3
    assert '<tr><td>mul</td><td class="good">PASS</td><td class="compare">MISMATCH</td>' in dom
    pixels = painted(out, tmp_path / "shot.png", "1200,3000")
    # the stylesheet was applied (the matrix cells have their colours) and the embedded
    # heatmap was decoded and drawn (its PASS colour fills whole cells)
    assert pixels[(0xD7, 0xF0, 0xD9)] > 2000, "no green table cells were painted"
    assert pixels[(0xFB, 0xE3, 0xBF)] > 500, "no mismatch table cells were painted"
    assert pixels[(0x3A, 0x9D, 0x4A)] > 5000, "the support heatmap image was not drawn"


def _upgrade_history(store):
    """Two check runs on onnxruntime 1.30.0 and 1.31.1: conv twice as slow, add twice as fast,
    relu the same; mul stops passing."""
    O = "onnx_cpu_fp32"
    a = [Res("conv2d_1", O, infer_ms=1.0, infer_ms_all=[1.0] * 3), Res("conv2d_2", O, infer_ms=2.0, infer_ms_all=[2.0] * 3),
         Res("add__x", O, infer_ms=2.0, infer_ms_all=[2.0] * 3), Res("relu", O, infer_ms=1.0, infer_ms_all=[1.0] * 3),
         Res("mul", O, infer_ms=1.0)]
    b = [Res("conv2d_1", O, infer_ms=2.0, infer_ms_all=[2.0] * 3), Res("conv2d_2", O, infer_ms=4.0, infer_ms_all=[4.0] * 3),
         Res("add__x", O, infer_ms=1.0, infer_ms_all=[1.0] * 3), Res("relu", O, infer_ms=1.0, infer_ms_all=[1.0] * 3),
         Res("mul", O, status="MISMATCH", infer_ms=1.0, max_abs=0.5)]
    write_run(store, Run("old", "2026-01-01T00:00:00Z", a, env={"onnxruntime": "1.30.0"}))
    write_run(store, Run("new", "2026-01-02T00:00:00Z", b))


@pytest.mark.slow
def test_upgrade_page_is_self_contained_and_renders_in_chromium(tmp_path):
    _upgrade_history(tmp_path / "store")
    proc = run(None, "--store", str(tmp_path / "store"), "report", "upgrade", "--by", "onnxruntime",
               "-o", str(tmp_path / "up.html"), entry=MODULE, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "up.html"
    text = out.read_text()
    assert len(re.findall(r'src="data:image/png;base64,', text)) == 1
    assert not re.search(r'(src|href)="(http|file|/)', text)
    # A = 1.30.0, B = 1.31.1; the family rows as computed by hand
    assert "<tr><td>onnxruntime</td><td>1.30.0</td><td>1.31.1</td></tr>" in text
    assert "<tr><td>conv2d</td><td>2</td><td>2</td><td>2</td><td>2</td><td>0</td></tr>" in text
    assert "<tr><td>add</td><td>1</td><td>0.5</td><td>0.5</td><td>0</td><td>1</td></tr>" in text
    assert "1 newly failing, 0 newly passing" in text and '<td class="compare">MISMATCH</td>' in text
    assert 'class="fail"' not in text       # only verdict cells are coloured
    require_chromium()
    dom = dump_dom(out)
    assert dom.count('src="data:image/png;base64,') == 1 and "<td>conv2d</td>" in dom
    pixels = painted(out, tmp_path / "shot.png", "1100,1600")
    # the plot was decoded and drawn: conv2d's median bar is red (slower), add's green (faster)
    assert pixels[(0xD0, 0x3A, 0x30)] > 30, "no slower-family bar was drawn"
    assert pixels[(0x3A, 0x9D, 0x4A)] > 30, "no faster-family bar was drawn"
    assert pixels[(0xFB, 0xE3, 0xBF)] > 200, "the newly failing MISMATCH cell was not painted"
