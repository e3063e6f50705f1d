"""The allocation timeline in real Chromium: a run holding the imported real snapshot draws
``#alloc-timeline`` and hovering a band shows the frames that allocated it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import rendered, severe_logs, wait_for
from helpers.snapshot_files import in_order

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"
DOCS_SHOT = ROOT / "docs" / "alloc-timeline.png"

#: The largest bar of a band allocated in the trace whose hover names a Python frame, and its middle (data
#: coordinates). The bands are one bar trace (a bar per stretch of a band where its lower edge holds still).
_BAND_JS = """
const gd = document.querySelector('#alloc-timeline .js-plotly-plot');
const t = gd._fullData[0];
let best = null;
for (let i = 0; i < t.x.length; i++) {
  const text = t.hovertext[i];
  if (!text.includes('.py:') || !text.includes('allocated at event')) continue;
  const area = t.width[i] * t.y[i];
  if (!best || area > best.area) best = {i, area, x: t.x[i], y: t.base[i] + t.y[i] / 2, text};
}
return best;
"""


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dashboard over one run that holds only the imported real snapshot."""
    from gpudash.cli import main as cli
    from gpudash.server.app import serve_in_thread

    root = tmp_path_factory.mktemp("snapshot-runs")
    assert cli(["import-snapshot", str(REAL), str(root / "imported"), "--step", "3"]) == 0
    url, stop = serve_in_thread(root, "127.0.0.1", 0)
    try:
        yield url
    finally:
        stop()


def _hover_band(driver: Any) -> tuple[dict[str, Any], str]:
    band = wait_for(lambda: driver.execute_script(_BAND_JS), what="a band with frames")
    driver.execute_script("Plotly.Fx.hover(document.querySelector('#alloc-timeline .js-plotly-plot'),"
                          "{xval: arguments[0], yval: arguments[1]})", band["x"], band["y"])
    text = wait_for(lambda: driver.execute_script(
        "const h = document.querySelector('#alloc-timeline .hoverlayer'); return h && h.textContent;"),
        what="hover label")
    return band, text


def test_alloc_timeline_drawn_with_frames_on_hover(driver: Any, imported: str, artifacts: Path) -> None:
    driver.get(imported + "run/imported")
    wait_for(lambda: rendered(driver, "alloc-timeline"), what="alloc-timeline rendered")
    bars = driver.execute_script("return document.querySelectorAll('#alloc-timeline .barlayer .point path').length")
    assert bars > 50  # the drawn allocations' bars
    notes = driver.execute_script("return document.querySelector('#alloc-timeline .annotation').textContent")
    assert "smaller allocations merged" in notes and "alive before the trace began" in notes
    ticks = driver.execute_script(
        "return Array.from(document.querySelectorAll('#alloc-timeline .ytick text')).map(t => t.textContent)")
    assert ticks and all(t.endswith("GiB") for t in ticks)
    band, text = _hover_band(driver)
    assert ".py:" in text and "model.py:" in text  # the frame that allocated the band
    assert "iB at 0x" in text
    seg = driver.execute_script("return document.querySelector('#segment-map .annotation').textContent")
    assert "showing the 60 largest of 216 segments" in seg
    driver.save_screenshot(str(artifacts / "alloc-timeline.png"))
    assert severe_logs(driver) == []


@pytest.mark.skipif(not os.environ.get("GPUDASH_UPDATE_SCREENSHOT"), reason="set GPUDASH_UPDATE_SCREENSHOT=1 to redo it")
def test_docs_alloc_timeline_screenshot(driver: Any, imported: str) -> None:
    """The README's picture of the allocation timeline (1280 px wide):
    GPUDASH_UPDATE_SCREENSHOT=1 pytest tests/browser/test_snapshot_views.py -k docs."""
    driver.set_window_size(1280, 1000)
    try:
        driver.get(imported + "run/imported")
        wait_for(lambda: rendered(driver, "alloc-timeline") and rendered(driver, "segment-map"), what="rendered")
        # the chart just under the replay bar that stays on screen, the window as tall as both
        bar = driver.execute_script("const b = document.querySelector('#replay-bar');"
                                    "return b ? b.getBoundingClientRect().height : 0")
        box = driver.execute_script("return document.querySelector('#alloc-timeline').getBoundingClientRect().height")
        inner = driver.execute_script("return window.innerHeight")
        driver.set_window_size(1280, 1000 + int(bar + box + 24) - int(inner))
        driver.execute_script("document.documentElement.style.overflowX = 'hidden';"
                              "const g = document.querySelector('#alloc-timeline');"
                              "window.scrollBy(0, g.getBoundingClientRect().top - arguments[0] - 12);", bar)
        time.sleep(0.8)
        _hover_band(driver)
        time.sleep(0.3)
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        driver.save_screenshot(str(DOCS_SHOT))
    finally:
        driver.set_window_size(1400, 1000)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A dashboard over a run holding two imported snapshots (the synthetic one at step 1, the real at 3)."""
    from gpudash.cli import main as cli
    from gpudash.server.app import serve_in_thread

    root = tmp_path_factory.mktemp("snapshot-pair")
    synth, real = in_order([ROOT / "tests" / "fixtures" / "snapshot_synthetic.pickle", REAL], root / "files")
    assert cli(["import-snapshot", str(synth), str(root / "pair"), "--step", "1"]) == 0
    assert cli(["import-snapshot", str(real), str(root / "pair"), "--step", "3"]) == 0
    url, stop = serve_in_thread(root, "127.0.0.1", 0)
    try:
        yield url
    finally:
        stop()


_META = "const gd = document.querySelector('#alloc-timeline .js-plotly-plot'); return gd && gd.layout.meta;"


def test_whole_trace_then_a_zoomed_window_at_full_detail(driver: Any, two: str, artifacts: Path) -> None:
    driver.get(two + "run/pair")
    wait_for(lambda: rendered(driver, "alloc-timeline"), what="alloc-timeline rendered")
    meta = driver.execute_script(_META)
    assert meta["window"] is None and meta["events"] == 2 * 1721  # the whole trace
    # an imported snapshot's page: its views and none of a training run's
    page = driver.execute_script("return document.body.innerText")
    assert "Largest live allocations" in page and "Finished" not in page and "Cost" not in page
    assert driver.execute_script("return document.querySelector('#step-time-graph, #cursor-slider')") is None
    # one zoom, right after the first draw: the chart's own {"autosize": true}, sent ~100 ms after it, used to
    # supersede the zoom's callback (Dash dropped its answer); only x changes reach the server now
    driver.execute_script("Plotly.relayout(document.querySelector('#alloc-timeline .js-plotly-plot'),"
                          "{'xaxis.range[0]': 1000, 'xaxis.range[1]': 1400})")
    meta = wait_for(lambda: (m := driver.execute_script(_META)) and m.get("window") and m, what="zoomed figure")
    assert meta["window"] == [1000, 1400] and meta["sampled"] == 401  # every event of the window
    merged = driver.execute_script(
        "const gd = document.querySelector('#alloc-timeline .js-plotly-plot');"
        "return gd.data[gd.data.length - 1].x.length")
    assert merged == 401
    title = driver.execute_script("return document.querySelector('#alloc-timeline .gtitle').textContent")
    assert "events 1,000-1,400 of 3,442" in title
    driver.save_screenshot(str(artifacts / "alloc-timeline-zoomed.png"))
    driver.execute_script("Plotly.relayout(document.querySelector('#alloc-timeline .js-plotly-plot'),"
                          "{'xaxis.autorange': true})")
    wait_for(lambda: (m := driver.execute_script(_META)) and m.get("window") is None, what="whole trace again")
    assert severe_logs(driver) == []


def test_the_diff_view(driver: Any, two: str, artifacts: Path) -> None:
    driver.get(two + "run/pair")
    wait_for(lambda: rendered(driver, "alloc-timeline"), what="alloc-timeline rendered")
    assert "pick a snapshot to compare with" in driver.execute_script(
        "return document.querySelector('#snapshot-diff-box').innerText")
    driver.find_element("css selector", "#snap-diff-pick").click()
    option = wait_for(lambda: next((o for o in driver.find_elements("css selector", "[role='option']")
                                    if "step 1" in o.text), None), what="the step 1 option")
    option.click()
    table = wait_for(lambda: driver.execute_script(
        "const t = document.querySelector('#snapshot-diff-table'); return t && t.innerText"), what="diff table")
    assert "model.py:" in table and "+" in table
    totals = driver.execute_script("return document.querySelector('#snapshot-diff-totals').innerText")
    assert "A: step 1" in totals and "B: step 3" in totals and "allocated" in totals
    wait_for(lambda: rendered(driver, "snapshot-diff-graph"), what="diff chart drawn")
    driver.execute_script("document.querySelector('#snapshot-diff-box').scrollIntoView()")
    driver.save_screenshot(str(artifacts / "snapshot-diff.png"))
    assert severe_logs(driver) == []
