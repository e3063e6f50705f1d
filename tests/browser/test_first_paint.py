"""The run page's first paint in real Chromium (issue 18): the loss spike is drawn with the first screen, the charts
below the fold only when scrolled to or opened (then as the address says), answers come compressed, and a live
run keeps extending a chart drawn late."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import severe_logs, wait_for

pytestmark = pytest.mark.browser

#: [drawn with data, trace count, layout.meta] of a chart, without scrolling to it.
STATE = """const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!g || !g._fullLayout || !g.querySelector('.main-svg')) { return null; }
return [g.layout.meta !== 'gpudash-lazy', g.data.length, g.layout.meta || null];"""
#: x of the named trace of a chart (a plain array in the page: typed arrays are decoded before plotting).
TRACE_X = """const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const t = g && g.data.find(t => (t.name || '').startsWith(arguments[1]));
return t ? Array.from(t.x) : null;"""


def drawn(driver: Any, graph_id: str) -> bool:
    s = driver.execute_script(STATE, graph_id)
    return bool(s and s[0] and s[1])


def waiting(driver: Any, graph_id: str) -> bool:
    s = driver.execute_script(STATE, graph_id)
    return bool(s and not s[0] and s[1] == 0)


def scroll_to(driver: Any, element_id: str) -> None:
    driver.execute_script("document.getElementById(arguments[0]).scrollIntoView({block: 'center'});", element_id)


def test_spike_at_first_paint_rest_when_scrolled_to(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.set_window_size(1280, 800)
    try:
        driver.get(url + "run/rich")
        wait_for(lambda: drawn(driver, "loss-graph"), what="loss chart drawn")
        assert driver.execute_script(TRACE_X, "loss-graph", "spike") == [20]  # the loss of 50 at step 20, marked
        assert driver.execute_script("return window.scrollY") == 0  # nothing scrolled: it came with the page
        for g in ("memory-graph", "step-time-graph"):
            assert drawn(driver, g), g
        time.sleep(1.5)  # the page has settled: what is below the fold still waits
        for g in ("rates-graph", "phases-graph", "host-graph", "signals-graph"):
            assert waiting(driver, g), g
        scroll_to(driver, "host-graph")
        wait_for(lambda: drawn(driver, "host-graph"), what="host chart drawn once scrolled to")
        # a folded section's chart waits until the section is opened, even when scrolled past
        driver.execute_script("document.getElementById('stability-view').open = false;")
        scroll_to(driver, "stability-view")
        time.sleep(1.5)
        assert waiting(driver, "signals-graph")
        driver.find_element("css selector", "#stability-view > summary").click()
        wait_for(lambda: drawn(driver, "signals-graph"), what="signals chart drawn once its section is opened")
        # the answers came compressed: the callbacks' bodies are smaller on the wire than decoded
        sizes = driver.execute_script(
            "return performance.getEntriesByType('resource').filter(r => r.name.includes('_dash-update-component')"
            " && r.decodedBodySize > 2000).map(r => [r.encodedBodySize, r.decodedBodySize]);")
        assert sizes and all(enc < dec for enc, dec in sizes), sizes
        # plotly.js, fetched early by the page, is fetched once (Dash's graph waited for it, did not load it again)
        # (gpudash's cartesian bundle, never Dash's full plotly.min.js)
        assert driver.execute_script("return performance.getEntriesByType('resource')"
                                     ".filter(r => r.name.includes('plotly-cartesian.min.js')).length") == 1
        assert driver.execute_script("return performance.getEntriesByType('resource')"
                                     ".filter(r => r.name.includes('/plotly.min.js')).length") == 0
        driver.save_screenshot(str(artifacts / "run-page-lazy.png"))
        assert severe_logs(driver) == []
    finally:
        driver.set_window_size(1400, 1000)


def test_lazy_charts_follow_the_address(driver: Any, served: tuple[str, Path]) -> None:
    """A link with a cursor and a zoom: the charts drawn late show both."""
    url, _ = served
    driver.get(url + "run/rich?cursor=10&x0=5&x1=15")
    wait_for(lambda: drawn(driver, "loss-graph"), what="loss chart drawn")
    for g in ("rates-graph", "phases-graph"):
        scroll_to(driver, g)
        wait_for(lambda g=g: drawn(driver, g), what=f"{g} drawn")
        rng = driver.execute_script(
            "return document.querySelector('#' + arguments[0] + ' .js-plotly-plot')._fullLayout.xaxis.range", g)
        assert [round(v) for v in rng] == [5, 15], (g, rng)
    cursor = driver.execute_script(
        "return document.querySelector('#phases-graph .js-plotly-plot').layout.shapes[0].x0")
    assert cursor == 10
    assert "x0=5" in driver.current_url and "cursor=10" in driver.current_url  # the first draw is not a zoom
    assert severe_logs(driver) == []


def test_live_run_extends_a_chart_drawn_late(driver: Any, served: tuple[str, Path]) -> None:
    from helpers.runmaker import LiveRun

    url, root = served
    with LiveRun(root / "live-lazy", delay=0.05, name="live-lazy"):
        time.sleep(1.0)
        driver.get(url + "run/live-lazy")
        wait_for(lambda: drawn(driver, "step-time-graph"), what="step-time chart")
        time.sleep(1.0)
        assert waiting(driver, "rates-graph")  # the live tick does not append to a chart not drawn
        scroll_to(driver, "rates-graph")
        wait_for(lambda: drawn(driver, "rates-graph"), what="rates chart drawn")
        n0 = len(driver.execute_script(TRACE_X, "rates-graph", ""))
        wait_for(lambda: len(driver.execute_script(TRACE_X, "rates-graph", "")) >= n0 + 5, what="rates chart grows")
        driver.execute_script("window.__gpudashNoReload = 1;")
        n1 = len(driver.execute_script(TRACE_X, "rates-graph", ""))
        wait_for(lambda: len(driver.execute_script(TRACE_X, "rates-graph", "")) >= n1 + 5,
                 what="rates chart extended")
        assert driver.execute_script("return window.__gpudashNoReload") == 1
    assert severe_logs(driver) == []
