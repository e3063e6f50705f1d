"""What a user reads on the charts, measured in real Chromium: binary units on ticks and hovers, human legend
names, no label drawn over another or cut off at the figure's edge."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import rendered, severe_logs, wait_for

pytestmark = pytest.mark.browser

#: Every text box of a plotly graph by role: legend, titles, tick labels (rects in page pixels).
_BOXES_JS = """
const root = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
const r = (el) => { const b = el.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
const all = (sel) => Array.from(root.querySelectorAll(sel)).filter(e => {
  const b = e.getBoundingClientRect(); return b.width > 0 && b.height > 0 && (e.textContent || '').trim() !== '' ||
  e.classList.contains('legend'); }).map(e => ({box: r(e), text: e.textContent}));
return {svg: r(root.querySelector('.main-svg')),
        legend: all('g.legend'),
        titles: all('.g-xtitle text, .g-ytitle text, [class^="g-y"][class$="title"] text, .g-gtitle text'),
        ticks: all('.xtick text, .ytick text, [class^="y"][class$="tick"] text')};
"""


def _hit(a: list[float], b: list[float], pad: float = 0.5) -> bool:
    return a[0] < b[2] - pad and b[0] < a[2] - pad and a[1] < b[3] - pad and b[1] < a[3] - pad


def label_problems(driver: Any, graph_id: str) -> list[str]:
    """Text boxes of ``graph_id`` that overlap another label or stick out of the figure."""
    b = driver.execute_script(_BOXES_JS, graph_id)
    out = []
    svg = b["svg"]
    for item in b["titles"] + b["ticks"] + b["legend"]:
        x0, y0, x1, y1 = item["box"]
        if x0 < svg[0] - 1 or y0 < svg[1] - 1 or x1 > svg[2] + 1 or y1 > svg[3] + 1:
            out.append(f"{graph_id}: {item['text'][:40]!r} clipped at the figure's edge")
    for leg in b["legend"]:
        for item in b["titles"] + b["ticks"]:
            if _hit(leg["box"], item["box"]):
                out.append(f"{graph_id}: legend over {item['text']!r}")
    titles = b["titles"]
    for t in titles:
        for tick in b["ticks"]:
            if _hit(t["box"], tick["box"]):
                out.append(f"{graph_id}: title {t['text']!r} over tick {tick['text']!r}")
    return out


def tick_texts(driver: Any, graph_id: str) -> list[str]:
    """Every tick label of ``graph_id``: x, y and the y axes of stacked panels (y2, y3, ...)."""
    return driver.execute_script(
        "const g = '#' + arguments[0];"
        "return Array.from(document.querySelectorAll(g + ' .xtick text, ' + g + ' [class^=\"y\"][class$=\"tick\"] text'))"
        ".map(e => e.textContent);", graph_id)


def hover_text(driver: Any, graph_id: str, point: int = 3) -> str:
    """The hover label plotly draws for the ``point``-th point of the first trace."""
    return driver.execute_script(
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "Plotly.Fx.hover(g, [{curveNumber: 0, pointNumber: arguments[1]}]);"
        "return Array.from(g.querySelectorAll('.hoverlayer text')).map(e => e.textContent).join(' | ');",
        graph_id, point)


LABELLED = ("memory-graph", "memory-at-graph", "step-time-graph", "rates-graph", "phases-graph", "host-graph",
            "loss-graph", "signals-graph", "segment-map", "activations-graph")


def test_units_on_ticks_and_hover(driver: Any, served: tuple[str, Path]) -> None:
    url, _ = served
    driver.get(url + "run/rich")
    for g in LABELLED:
        wait_for(lambda g=g: rendered(driver, g), what=f"{g} rendered")
    mem_ticks = tick_texts(driver, "memory-graph")
    assert any(t.endswith(("KiB", "MiB")) for t in mem_ticks), mem_ticks
    for g in ("memory-graph", "memory-at-graph", "host-graph", "segment-map", "activations-graph"):
        ticks = tick_texts(driver, g)
        assert not [t for t in ticks if t.endswith(("kB", "MB", "GB", "B")) and not t.endswith("iB")
                    and t != "0 B"], (g, ticks)  # no decimal SI bytes, no "0.00B"
    hover = hover_text(driver, "memory-graph")
    assert "KiB" in hover or "MiB" in hover, hover
    step_hover = hover_text(driver, "step-time-graph")
    assert " ms" in step_hover or " µs" in step_hover, step_hover  # not raw seconds such as 0.00516177
    names = driver.execute_script(
        "return Array.from(document.querySelectorAll('#host-graph .legendtext')).map(e => e.textContent);")
    assert names and not [n for n in names if "_" in n], names  # "process RSS", not rss_bytes
    assert severe_logs(driver) == []


def test_no_label_overlaps_or_clipping(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.get(url + "run/rich")
    for g in LABELLED:
        wait_for(lambda g=g: rendered(driver, g), what=f"{g} rendered")
    problems = [p for g in LABELLED for p in label_problems(driver, g)]
    driver.save_screenshot(str(artifacts / "run-page-labels.png"))
    assert problems == []


def test_long_run_drawn_whole_with_spike(driver: Any, tmp_path: Path, artifacts: Path) -> None:
    """200,000 short steps: the charts start at step 0 and show the spike at step 150,000; the header says the
    run's last step."""
    from helpers.runmaker import long_run

    from gpudash.server.app import serve_in_thread

    long_run(tmp_path / "long")
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)
    trace = ("const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
             "const t = g.data.find(t => t.name === arguments[1]); return t ? [t.x, t.y] : null;")
    try:
        driver.get(url + "run/long")
        for g in ("memory-graph", "loss-graph"):
            wait_for(lambda g=g: rendered(driver, g), what=f"{g} rendered")
        x, y = driver.execute_script(trace, "memory-graph", "activations")
        assert x[0] == 0 and x[-1] == 199_999 and 150_000 in x
        assert y[x.index(150_000)] > 50 * sorted(y)[len(y) // 2]  # the spike stands out, drawn at its height
        rng = driver.execute_script("return document.querySelector('#memory-graph .js-plotly-plot')"
                                    "._fullLayout.xaxis.range")
        assert rng[0] <= 0 and rng[1] >= 199_999
        assert driver.execute_script(trace, "loss-graph", "spike")[0] == [150_000]
        assert driver.find_element("id", "last-step").text == "199999"
        driver.save_screenshot(str(artifacts / "run-page-long.png"))
        assert severe_logs(driver) == []
    finally:
        driver.get("about:blank")  # no request of this page reaches the stopped server
        stop()


def test_runs_list_is_live_with_search_and_filter(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    """A run started after the page opened appears by itself; its steps move; search and status filter the rows."""
    from helpers.runmaker import LiveRun

    url, root = served
    driver.get(url)
    wait_for(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), what="runs table")
    driver.execute_script("window.__gpudashNoReload = 1;")
    before = len(driver.find_elements("css selector", "#runs-table tbody tr"))
    boxes = driver.find_elements("css selector", "#runs-table input[type=checkbox]")
    ticked = boxes[0].get_attribute("value")
    boxes[0].click()  # a ticked compare box survives the refreshes
    row_sel = "#runs-table tr[id*='appeared']"
    with LiveRun(root / "appeared", delay=0.05, name="appeared-later"):
        row = wait_for(lambda: driver.find_elements("css selector", row_sel), timeout=15, what="new run's row")
        assert "live" in row[0].text
        cells = lambda: driver.find_elements("css selector", row_sel + " td")  # noqa: E731

        def steps_now() -> int:
            return int(cells()[6].text.replace(",", ""))

        first = wait_for(steps_now, what="steps shown")
        wait_for(lambda: steps_now() > first, what="steps of the live run moving")
        assert len(driver.find_elements("css selector", "#runs-table tbody tr")) == before + 1
        assert [b.get_attribute("value") for b in driver.find_elements("css selector", "#runs-table input[type=checkbox]")
                if b.is_selected()] == [ticked]
        search = driver.find_element("id", "runs-search")
        search.send_keys("appeared")
        wait_for(lambda: len(driver.find_elements("css selector", "#runs-table tbody tr")) == 1, what="search")
        search.clear()
        search.send_keys("no such run")
        wait_for(lambda: not driver.find_elements("css selector", "#runs-table tbody tr"), what="nothing matches")
        assert "no run matches" in driver.find_element("id", "runs-table-box").text
        driver.execute_script("arguments[0].value = ''", search)
        search.send_keys(" ")
        wait_for(lambda: len(driver.find_elements("css selector", "#runs-table tbody tr")) == before + 1,
                 what="search cleared")
        driver.find_element("css selector", "#runs-status input[value='live']").click()
        wait_for(lambda: [r.text for r in driver.find_elements("css selector", "#runs-table tbody tr")] and all(
            "live" in r.text for r in driver.find_elements("css selector", "#runs-table tbody tr")), what="live only")
        driver.save_screenshot(str(artifacts / "runs-page-live.png"))
    wait_for(lambda: not driver.find_elements("css selector", "#runs-table tbody tr"), what="finished run leaves 'live'")
    assert driver.execute_script("return window.__gpudashNoReload") == 1  # no reload
    assert severe_logs(driver) == []


def _acts_title(driver: Any) -> str:
    return driver.execute_script(
        "const g = document.querySelector('#activations-graph .js-plotly-plot');"
        "return g ? (g.layout.title.text || '') + ' | ' + (g.layout.annotations || []).map(a => a.text).join(' ') : '';")


def test_replay_step_box_url_and_speed(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    """Enter in the step box moves the cursor; activations follow it; cursor and zoom go into the address and a
    copied link reopens them; the default speed plays the run in about 30 s."""
    from gpudash.store.reader import RunReader

    url, root = served
    sampled = sorted(int(s) for s in RunReader(root / "rich").read_table("activations")["step"].unique())
    assert sampled and sampled[0] > 0, sampled  # the toy run samples activations after its first step
    driver.get(url + "run/rich")
    for g in ("memory-graph", "activations-graph", "loss-graph"):
        wait_for(lambda g=g: rendered(driver, g), what=f"{g} rendered")
    speed = driver.execute_script("return document.querySelector('#speed').textContent")
    assert "whole run in 30 s" in speed, speed
    time.sleep(0.5)
    assert driver.current_url == url + "run/rich"  # a page opened at the run's end keeps its address as typed
    box = driver.find_element("id", "cursor-input")
    box.send_keys("0\n")  # before the run's first sampled activation step
    wait_for(lambda: driver.find_element("id", "cursor-label").text == "0", what="cursor at step 0 after Enter")
    wait_for(lambda: "no sampled step at or before" in _acts_title(driver), what="activations follow to step 0")
    wait_for(lambda: "cursor=0" in driver.current_url, what="cursor in the address")
    box.clear()
    box.send_keys("20\n")
    wait_for(lambda: driver.find_element("id", "cursor-label").text == "20", what="cursor at step 20")
    want = f"(step {max(s for s in sampled if s <= 20)},"
    wait_for(lambda: want in _acts_title(driver), what="activations of the last sampled step again")
    for _ in range(3):  # the graph binds its relayout handler a moment after the first draw
        driver.execute_script("Plotly.relayout(document.querySelector('#loss-graph .js-plotly-plot'), "
                              "{'xaxis.range[0]': 5, 'xaxis.range[1]': 25});")
        try:
            wait_for(lambda: "x0=5" in driver.current_url and "x1=25" in driver.current_url, timeout=5, what="zoom")
            break
        except AssertionError:
            continue
    link = driver.current_url
    assert "cursor=20" in link and "x0=5" in link
    driver.get("about:blank")
    driver.get(link)  # the copied link
    wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph from the link")
    assert driver.find_element("id", "cursor-label").text == "20"
    rng = driver.execute_script("return document.querySelector('#memory-graph .js-plotly-plot')._fullLayout.xaxis.range")
    assert [round(v) for v in rng] == [5, 25]
    line = driver.execute_script("return document.querySelector('#loss-graph .js-plotly-plot').layout.shapes[0]")
    assert line["x0"] == 20 and line["visible"]
    driver.save_screenshot(str(artifacts / "run-page-from-link.png"))
    assert severe_logs(driver) == []


def test_compare_baseline_and_overlays(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    """Loss, throughput, memory and step time overlaid; the baseline is chosen, and the ratios follow it."""
    url, _ = served
    driver.get(url + "compare?runs=rich,plain")
    for g in ("compare-loss", "compare-throughput", "compare-memory", "compare-step-time"):
        wait_for(lambda g=g: rendered(driver, g), what=f"{g} rendered")
        n = driver.execute_script(f"return document.querySelector('#{g} .js-plotly-plot').data.length")
        assert n == 2, g

    def first_col() -> list[str]:
        return [c.text for c in driver.find_elements("css selector", "#compare-table td[data-dash-column='run']")]

    assert wait_for(first_col, what="compare table")[0].endswith("(baseline)")
    driver.find_element("css selector", "#compare-baseline").click()
    option = wait_for(lambda: [e for e in driver.find_elements("css selector", "[role=option]")
                               if e.is_displayed() and e.text.strip() == "plain"], what="baseline option")
    option[0].click()
    wait_for(lambda: "base=1" in driver.current_url, what="baseline in the address")
    wait_for(lambda: first_col() and first_col()[1].endswith("(baseline)"), what="table against the new baseline")
    ratios = [c.text for c in driver.find_elements("css selector",
                                                   "#compare-table td[data-dash-column='step time vs baseline']")]
    assert ratios[1] == "1.00x"
    for g in ("compare-loss", "compare-throughput", "compare-memory", "compare-step-time"):
        wait_for(lambda g=g: rendered(driver, g), what=f"{g} redrawn")
    assert [p for g in ("compare-loss", "compare-throughput", "compare-memory", "compare-step-time")
            for p in label_problems(driver, g)] == []
    assert any(t.endswith("iB") for t in tick_texts(driver, "compare-memory"))
    driver.save_screenshot(str(artifacts / "compare-baseline.png"))
    assert severe_logs(driver) == []


def test_section_navigation_stays_on_screen(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.get(url + "run/rich")
    wait_for(lambda: rendered(driver, "loss-graph"), what="loss graph")
    labels = [a.text for a in driver.find_elements("css selector", "#section-nav a")]
    assert labels == ["Summary", "Memory", "Throughput", "Device", "Stability", "Events", "Hot spots"]  # one rank
    driver.find_element("link text", "Stability").click()
    top = lambda sel: driver.execute_script(  # noqa: E731
        "return document.querySelector(arguments[0]).getBoundingClientRect().top", sel)
    wait_for(lambda: 0 <= top("#stability-view") < 250, what="scrolled to the Stability section")
    assert 0 <= top("#section-nav") < 120  # the navigation is still on screen
    driver.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    wait_for(lambda: 0 <= top("#section-nav") < 120, what="navigation on screen at the bottom")
    driver.find_element("link text", "Memory").click()
    wait_for(lambda: 0 <= top("#memory-view") < 250, what="back up to Memory")
    driver.find_element("css selector", "#memory-view > summary").click()  # sections fold away
    wait_for(lambda: not driver.find_element("id", "memory-graph").is_displayed(), what="memory section folded")
    assert driver.find_element("id", "step-time-graph").is_displayed()
    driver.save_screenshot(str(artifacts / "run-page-nav.png"))
    assert severe_logs(driver) == []


def test_smoothing_control_and_link(driver: Any, served: tuple[str, Path]) -> None:
    url, _ = served
    driver.get(url + "run/rich")
    wait_for(lambda: rendered(driver, "loss-graph") and rendered(driver, "rates-graph"), what="loss and rates")
    names = ("return Array.from(document.querySelector('#' + arguments[0] + ' .js-plotly-plot').data)"
             ".map(t => t.name);")
    assert "loss (EMA 0.9)" not in driver.execute_script(names, "loss-graph")
    driver.find_element("css selector", "#smoothing").click()
    option = wait_for(lambda: [e for e in driver.find_elements("css selector", "[role=option]")
                               if e.is_displayed() and e.text.strip() == "EMA 0.9"], what="smoothing option")
    option[0].click()
    wait_for(lambda: "loss (EMA 0.9)" in driver.execute_script(names, "loss-graph"), what="EMA line on the loss")
    wait_for(lambda: any("(EMA 0.9)" in n for n in driver.execute_script(names, "rates-graph")),
             what="EMA line on the throughput")
    wait_for(lambda: "smooth=0.9" in driver.current_url, what="smoothing in the address")
    link = driver.current_url
    driver.get("about:blank")
    driver.get(link)
    wait_for(lambda: "loss (EMA 0.9)" in driver.execute_script(names, "loss-graph"), what="EMA from the link")
    assert severe_logs(driver) == []


def _dark(driver: Any) -> bool:
    return bool(driver.execute_script("return document.body.classList.contains('dark')"))


def _tick_fill(driver: Any, graph_id: str) -> int:
    """The brightness (0-255) of a y tick label of ``graph_id`` as drawn."""
    fill = driver.execute_script(
        "const t = document.querySelector('#' + arguments[0] + ' .ytick text');"
        "return t ? getComputedStyle(t).fill : '';", graph_id)
    return int(sum(int(v) for v in fill[fill.index("(") + 1:fill.index(")")].split(",")[:3]) / 3)


def test_dark_mode_follows_system_toggle_and_link(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.execute_script("try { localStorage.removeItem('gpudash-theme'); } catch (e) {}")
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme",
                                                                        "value": "dark"}]})
    try:
        driver.get(url + "run/rich")
        wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph")
        assert _dark(driver)  # the system's choice
        assert _tick_fill(driver, "memory-graph") > 170  # light text on the dark page
        bg = driver.execute_script("return getComputedStyle(document.querySelector('#memory-view')).backgroundColor")
        assert bg == "rgb(24, 27, 33)"
        full = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1400, min(int(full) + 40, 6000))
        driver.save_screenshot(str(artifacts / "run-page-dark.png"))
        driver.set_window_size(1400, 1000)
        driver.find_element("id", "theme-toggle").click()  # the toggle wins over the system, and is remembered
        assert not _dark(driver) and _tick_fill(driver, "memory-graph") < 120
        driver.get(url + "run/rich")
        wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph again")
        assert not _dark(driver)
        driver.get(url + "run/rich?theme=dark")  # a link that names the theme
        wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph from a dark link")
        assert _dark(driver)
        assert severe_logs(driver) == []
    finally:
        driver.execute_script("try { localStorage.removeItem('gpudash-theme'); } catch (e) {}")
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_device_panels_labels_clear(driver: Any, tmp_path: Path) -> None:
    """NVML-style panels (%, MiB/s, bytes, W, °C, MHz) stacked: no panel title over another's ticks."""
    import time

    from gpudash.server.app import serve_in_thread
    from gpudash.store.writer import Recorder

    rec = Recorder(tmp_path / "gpu", flush_interval=0.1, meta={"device": "cuda:0", "device_name": "H100"})
    start = time.time()
    for k in range(60):
        rec.put("device", {"time": start + k * 0.1, "gpu": 0, "sm_active_pct": 50.0, "util_pct": 90.0,
                           "pcie_tx_mib_s": 10.0 * k, "pcie_rx_mib_s": 5.0, "power_w": 300.0 + k,
                           "temp_c": 60.0, "sm_clock_mhz": 1800.0, "used_bytes": 30e9 + 1e8 * k})
        rec.put("steps", {"step": k, "time": start + k * 0.1, "duration_s": 0.1})
    rec.close()
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)
    try:
        driver.get(url + "run/gpu")
        wait_for(lambda: rendered(driver, "device-graph"), what="device graph")
        assert label_problems(driver, "device-graph") == []
        ticks = tick_texts(driver, "device-graph")
        assert any(t.endswith(" GiB") for t in ticks), ticks
        assert not any(t.endswith("GB") for t in ticks), ticks
        names = driver.execute_script(
            "return Array.from(document.querySelectorAll('#device-graph .legendtext')).map(e => e.textContent);")
        assert "SM active" in names and "PCIe TX" in names and not [n for n in names if "_" in n]
    finally:
        driver.get("about:blank")
        stop()
