"""`opdiff report site`: a static folder of HTML over a history with planted changes, opened
in headless Chromium as the HTML report is (tests/test_analytics_html.py)."""

from __future__ import annotations

import re

import pytest
from helpers.cli import MODULE, run
from helpers.history.planted import generate
from test_analytics_html import dump_dom, painted, require_chromium

from opdiff_snap import api
from opdiff_snap.analytics.findings import REGRESSION
from opdiff_snap.analytics.site import page_name
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_site_pages_link_up_and_render_in_chromium(tmp_path):
    store = tmp_path / "store"
    generate(store, runs=18, tests=4, envs=3, plant_frac=0.2, seed=7, presets=("onnx_cpu_fp32", "coreml_any_fp16"))
    proc = run(None, "--store", str(store), "report", "site", "-o", str(tmp_path / "site"), entry=MODULE,
               timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    index = tmp_path / "site" / "index.html"
    page = index.read_text()
    # presets x the three environments, each cell passed / results of the latest run there
    assert page.count("<th class='env'>torch ") == 3
    assert len(re.findall(r"<td class='(good|part|fail)'>\d+/4</td>", page)) == 6
    links = re.findall(r"href='(tests/[^']+\.html)'", page)
    assert len(links) == 4 and all((tmp_path / "site" / link).is_file() for link in links)
    assert not re.search(r"(src|href)=['\"](http|file|/)", page)

    found = api.regressions(settings=Settings(store=store))
    step = next(f for f in found if f.kind == "latency" and f.direction == REGRESSION)
    test_page = tmp_path / "site" / "tests" / f"{page_name(step.test_id)}.html"
    html = test_page.read_text()
    assert f"src='{page_name(step.test_id)}.png'" in html and step.run_id in html
    assert (test_page.with_suffix(".png")).read_bytes()[:8] == PNG

    require_chromium()
    dom = dump_dom(index)
    assert dom.count("<th class=\"env\">") == 3 and dom.count('<a href="tests/') == 4
    pixels = painted(test_page, tmp_path / "shot.png", "900,2400")
    # the plot (a separate file beside the page) was loaded and drawn: passing runs as green
    # points, the detected slowdown as a red line
    assert pixels[(0x3A, 0x9D, 0x4A)] > 60, "no passing runs were drawn"
    assert pixels[(0xD0, 0x3A, 0x30)] > 60, "the detected step was not drawn"


def test_site_replaces_its_folder_whole_and_never_writes_through_a_link(tmp_path):
    store = tmp_path / "store"
    generate(store, runs=6, tests=2, envs=2, plant_frac=0.0, seed=1, presets=("onnx_cpu_fp32",))
    settings = Settings(store=store)
    site = tmp_path / "site"
    api.site(site, settings=settings)
    (site / "tests" / "gone-00000000.html").write_text("a test that no longer exists")
    api.site(site, settings=settings)                       # an earlier site: replaced whole
    assert not (site / "tests" / "gone-00000000.html").exists()
    assert len(list((site / "tests").glob("*.html"))) == 2 and (site / "index.html").is_file()

    outside = tmp_path / "outside.html"
    outside.write_text("not the site's")
    (site / "index.html").unlink()
    (site / "index.html").symlink_to(outside)                # a link planted in the site: not followed
    api.site(site, settings=settings)
    assert outside.read_text() == "not the site's"
    assert not (site / "index.html").is_symlink() and "<html" in (site / "index.html").read_text()
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(OpdiffError, match="is a symbolic link"):
        api.site(linked, settings=settings)
    assert not (tmp_path / "elsewhere").exists()

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(OpdiffError, match="holds files that are not a site"):
        api.site(mine, settings=settings)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "debris beside the site"
