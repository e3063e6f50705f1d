"""Real headless Chromium against a real server: pages render, no console errors, live updates arrive."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import full_screenshot, rendered, severe_logs, wait_for

pytestmark = pytest.mark.browser

RUN_VIEWS = ("memory-graph", "memory-at-graph", "segment-map", "activations-graph", "step-time-graph", "rates-graph",
             "phases-graph", "host-graph", "loss-graph", "signals-graph", "events-graph")
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshot-run-page.png"


def test_runs_page(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.get(url)
    rows = wait_for(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), what="runs table")
    assert len(rows) == 2
    links = [a.get_attribute("href") for a in driver.find_elements("css selector", "#runs-table a.run-link")]
    assert links[0].endswith("/run/plain") and links[1].endswith("/run/rich")  # newest first
    assert "finished" in rows[0].text and "cpu" in rows[0].text
    driver.save_screenshot(str(artifacts / "runs-page.png"))
    assert severe_logs(driver) == []


def test_runs_pager(driver: Any, served: tuple[str, Path], artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run a page: "older →" shows the older run, "← newer" the newer again; a search starts at page 1."""
    from gpudash.server.layouts import runs

    monkeypatch.setattr(runs, "PER_PAGE", 1)
    url, _ = served
    driver.get(url)

    def links() -> list[str]:
        return [str(a.get_attribute("href")).rsplit("/", 1)[-1]
                for a in driver.find_elements("css selector", "#runs-table a.run-link")]

    wait_for(lambda: links() == ["plain"], what="first page")
    assert "page 1 of 2" in driver.find_element("id", "runs-page-label").text
    assert not driver.find_element("id", "runs-prev").is_enabled()  # the newest page: nothing newer
    driver.find_element("id", "runs-next").click()
    wait_for(lambda: links() == ["rich"], what="older page")
    assert "page 2 of 2" in driver.find_element("id", "runs-page-label").text
    wait_for(lambda: not driver.find_element("id", "runs-next").is_enabled(), what="the last page")
    driver.find_element("id", "runs-prev").click()
    wait_for(lambda: links() == ["plain"], what="newer page")
    driver.find_element("id", "runs-next").click()
    wait_for(lambda: links() == ["rich"], what="older page again")
    driver.find_element("id", "runs-search").send_keys("plain")
    wait_for(lambda: links() == ["plain"], what="a search starts at page 1")
    driver.save_screenshot(str(artifacts / "runs-pager.png"))
    assert severe_logs(driver) == []


def test_run_page_every_view(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.get(url + "run/rich")
    for graph_id in RUN_VIEWS:
        wait_for(lambda g=graph_id: rendered(driver, g), what=f"{graph_id} rendered")
    assert driver.find_element("id", "last-step").text == "39"
    # names from run files are text: the hostile name shows literally and no <img> was injected
    assert driver.find_element("id", "run-name").text == "rich <img src=x onerror=alert(1)>"
    assert driver.execute_script("return document.querySelectorAll('img[src=\"x\"]').length") == 0
    reason = driver.find_element("id", "device-graph-reason").text
    assert "NVML" in reason
    # the tables are built when scrolled to (tests/layouts/test_lazy.py: what the box says until then)
    driver.execute_script("document.getElementById('hotspots-box').scrollIntoView()")
    wait_for(lambda: driver.find_elements("css selector", "#hotspots-table td"), what="hot spots table built")
    assert driver.find_elements("css selector", "#stability-lights .light-red")  # the OOM
    assert not driver.find_elements("id", "ranks-view")  # one rank: no Ranks section, no empty chart
    # the post-mortem verdicts arrive after the first paint (when gpudash.analysis provides summarize)
    import importlib.util

    if importlib.util.find_spec("gpudash.analysis.summary") is not None:
        verdicts = wait_for(lambda: driver.find_elements("css selector", "#summary-panel .verdict"),
                            what="summary verdicts")
        oom = next(v.text for v in verdicts if "OOM" in v.text)
        assert "(step 36)" in oom and "saves: " in oom  # Verdict.step_range and Verdict.saving, as text
    time.sleep(0.5)
    full_screenshot(driver, artifacts / "run-page.png")
    assert severe_logs(driver) == []


def test_run_page_ranks_section(driver: Any, tmp_path: Path, artifacts: Path) -> None:
    """A two-rank run (rank 1 straggles in its data phase) shows its ranks side by side and names the straggler."""
    from helpers.ranks import STEPS, record_two_ranks

    from gpudash.server.app import serve_in_thread

    record_two_ranks(tmp_path / "ddp")
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)
    try:
        driver.get(url + "run/ddp")
        wait_for(lambda: rendered(driver, "rank-step-graph"), what="step time per rank")
        names = driver.execute_script(
            "return document.querySelector('#rank-step-graph .js-plotly-plot').data.map(t => t.name)")
        assert names == ["rank 0", "rank 1"]
        rows = driver.find_elements("css selector", "#ranks-table tbody tr")
        cells = [[c.text for c in r.find_elements("css selector", "td")] for r in rows]
        cells = [c for c in cells if c]  # the header row has th cells only
        assert [c[0] for c in cells] == ["0", "1"] and all(c[1] == str(STEPS) for c in cells)
        lights = driver.find_element("id", "straggler-lights").text
        assert "rank 1 (slow in data)" in lights
        driver.execute_script("document.getElementById('ranks-view').scrollIntoView(); window.scrollBy(0, -90)")
        time.sleep(0.3)
        driver.save_screenshot(str(artifacts / "run-page-ranks.png"))
        assert severe_logs(driver) == []
    finally:
        driver.get("about:blank")  # no request of this page (a lazy fill on scroll) may reach the stopped server
        stop()
        driver.get_log("browser")


def test_ranks_section_refreshes_live(driver: Any, tmp_path: Path) -> None:
    """While a two-rank run is live the Ranks section catches up (every few ticks), and once after it ends."""
    import threading

    from helpers.ranks import record_two_ranks

    from gpudash.server.app import serve_in_thread

    steps = 300
    writer = threading.Thread(target=record_two_ranks, args=(tmp_path / "ddp-live", steps), daemon=True)
    writer.start()
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)

    def steps_of_rank0() -> int:
        return int(driver.find_element("css selector", "#ranks-table tbody tr td[data-dash-column=steps]").text)

    try:
        wait_for(lambda: (tmp_path / "ddp-live" / "rank1.db").exists(), what="rank 1 recording")
        time.sleep(0.5)
        driver.get(url + "run/ddp-live")
        first = wait_for(steps_of_rank0, what="ranks table")
        assert first < steps
        wait_for(lambda: steps_of_rank0() > first, timeout=30, what="ranks table refreshed while live")
        writer.join(60)
        wait_for(lambda: steps_of_rank0() == steps, timeout=30, what="ranks table complete after the run ends")
        assert severe_logs(driver) == []
    finally:
        driver.get("about:blank")  # no request of this page may reach the stopped server (the next test's log)
        stop()
        driver.get_log("browser")


def test_replay_cursor_jumps_to_events(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.get(url + "run/rich")
    wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph")
    assert driver.find_element("id", "cursor-label").text == "39"
    driver.find_element("id", "prev-event").click()
    wait_for(lambda: driver.find_element("id", "cursor-label").text == "36", what="cursor at the OOM (step 36)")
    wait_for(lambda: "step 36" in driver.execute_script(
        "return document.querySelector('#memory-at-graph .gtitle').textContent"), what="memory map follows cursor")
    x0 = driver.execute_script(
        "return document.querySelector('#memory-graph .js-plotly-plot').layout.shapes[0].x0")
    assert x0 == 36
    driver.find_element("id", "play-button").click()
    wait_for(lambda: int(driver.find_element("id", "cursor-label").text) != 36, what="play advances the cursor")
    driver.find_element("id", "play-button").click()
    # clicking an event in the table moves the cursor to its step (the first rows are at step 0)
    driver.execute_script("document.getElementById('events-box').scrollIntoView()")
    wait_for(lambda: driver.find_elements("css selector", "#events-table td[data-dash-column=kind]"),
             what="events table built when scrolled to")
    driver.find_element("css selector", "#events-table td[data-dash-column=kind]").click()
    wait_for(lambda: driver.find_element("id", "cursor-label").text == "0", what="cursor at the clicked event")
    driver.save_screenshot(str(artifacts / "run-page-replay.png"))
    assert severe_logs(driver) == []


def test_last_step_advances_live(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    from helpers.runmaker import LiveRun

    url, root = served
    with LiveRun(root / "live", delay=0.05, name="live-run"):
        wait_for(lambda: (root / "live" / "rank0.db").exists(), what="run started")
        time.sleep(1.0)
        driver.get(url + "run/live")
        wait_for(lambda: rendered(driver, "step-time-graph"), what="step-time graph")
        driver.execute_script("window.__gpudashNoReload = 1;")
        assert driver.find_element("id", "run-status").text == "live"
        seen = []
        deadline = time.time() + 20
        while time.time() < deadline and len(set(seen)) < 4:
            text = driver.find_element("id", "last-step").text
            if text.isdigit() and (not seen or int(text) != seen[-1]):
                seen.append(int(text))
            time.sleep(0.2)
        assert len(set(seen)) >= 4 and seen == sorted(seen), seen
        assert driver.execute_script("return window.__gpudashNoReload") == 1  # updated without a reload
        n_points = driver.execute_script(
            "return document.querySelector('#step-time-graph .js-plotly-plot').data[0].x.length")
        assert n_points > 5
        driver.find_element("id", "snapshot-request").click()
        wait_for(lambda: "requested" in driver.find_element("id", "snapshot-requested").text, what="snapshot asked")
        assert (root / "live" / "snapshot.request").exists()  # what the snapshots collector polls for
        driver.save_screenshot(str(artifacts / "run-page-live.png"))
    wait_for(lambda: driver.find_element("id", "run-status").text == "finished", what="status finished")
    assert severe_logs(driver) == []


def test_compare_page(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    url, _ = served
    driver.get(url)
    wait_for(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), what="runs table")
    for box in driver.find_elements("css selector", "#runs-table input[type=checkbox]")[:2]:
        box.click()
    wait_for(lambda: "runs=" in (driver.find_element("id", "compare-link").get_attribute("href") or ""),
             what="compare link")
    driver.find_element("id", "compare-link").click()
    wait_for(lambda: rendered(driver, "compare-memory") and rendered(driver, "compare-step-time"), what="compare")
    assert len(driver.find_elements("css selector", "#compare-table tbody tr")) >= 2
    driver.save_screenshot(str(artifacts / "compare-page.png"))
    assert severe_logs(driver) == []


def test_no_horizontal_scroll_on_a_laptop(driver: Any, served: tuple[str, Path]) -> None:
    """At 1280 px wide (a laptop) no page is wider than the window: nothing to scroll sideways."""
    url, _ = served
    size = driver.get_window_size()
    driver.set_window_size(1280, 900)
    try:
        for path, ready in (("", "#runs-table tbody tr"), ("run/rich", "#memory-graph .main-svg"),
                            ("compare?runs=rich,plain", "#compare-memory .main-svg")):
            driver.get(url + path)
            wait_for(lambda r=ready: driver.find_elements("css selector", r), what=f"{path or 'runs'} page")
            time.sleep(0.5)
            wide = driver.execute_script("""const W = document.documentElement.clientWidth;
              return [document.documentElement.scrollWidth, W, Array.from(document.querySelectorAll('body *'))
                .filter(e => e.getBoundingClientRect().right > W + 1).slice(0, 3)
                .map(e => e.tagName + '#' + e.id + '.' + e.className)];""")
            assert wide[0] <= wide[1], (path, wide)
    finally:
        driver.set_window_size(size["width"], size["height"])


@pytest.mark.skipif(not os.environ.get("GPUDASH_UPDATE_SCREENSHOT"), reason="set GPUDASH_UPDATE_SCREENSHOT=1 to redo it")
def test_docs_screenshot(driver: Any, tmp_path: Path, artifacts: Path) -> None:
    """The README's picture of the run page: GPUDASH_UPDATE_SCREENSHOT=1 pytest tests/browser -k docs."""
    from helpers.runmaker import train

    from gpudash.server.app import serve_in_thread

    train(tmp_path / "tiny-mlp", 60, rich=True, name="tiny-mlp (CPU, budget 1 MiB)", hostile=False)
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)
    try:
        driver.get(url + "run/tiny-mlp")
        for graph_id in RUN_VIEWS:
            wait_for(lambda g=graph_id: rendered(driver, g), what=f"{graph_id} rendered")
        wait_for(lambda: driver.find_elements("css selector", "#summary-panel .verdict"), what="verdicts")
        time.sleep(0.5)
        full_screenshot(driver, artifacts / "docs-run-page.png")
    finally:
        stop()
    DOCS_SHOT.parent.mkdir(exist_ok=True)
    shutil.copy(artifacts / "docs-run-page.png", DOCS_SHOT)


def test_zoom_requeries_long_run(driver: Any, tmp_path: Path, artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run longer than the point budget is sent downsampled; zooming re-reads the range at full detail, even
    when the chart resizes while the answer is on its way."""
    from gpudash.server.app import serve_in_thread
    from gpudash.server.layouts import run_callbacks
    from gpudash.server.layouts.downsample import MAX_POINTS
    from gpudash.store.writer import Recorder

    n = 20_000
    rec = Recorder(tmp_path / "long", flush_interval=0.2, meta={"name": "long", "device": "cpu"})
    for s in range(n):
        t = 1000.0 + 0.1 * s
        rec.put("steps", {"step": s, "time": t, "duration_s": 0.1 + (s % 7) * 1e-3, "loss": 1.0 / (1 + s)})
        rec.put("memory", {"step": s, "time": t, "params_bytes": 1e6, "grads_bytes": 1e6,
                           "optimizer_bytes": 2e6 + (s % 100) * 1e3})
    rec.close()
    redraw = run_callbacks.zoom_redraw

    def slow_redraw(*args: Any, **kwargs: Any) -> Any:  # a loaded server: the answer takes a while
        time.sleep(1.0)
        return redraw(*args, **kwargs)

    monkeypatch.setattr(run_callbacks, "zoom_redraw", slow_redraw)
    url, stop = serve_in_thread(tmp_path, "127.0.0.1", 0)
    get_x = "return document.querySelector('#memory-graph .js-plotly-plot').data[0].x"
    try:
        driver.get(url + "run/long")
        wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph")
        assert len(driver.execute_script(get_x)) <= MAX_POINTS
        # a zoom, and while its answer is on the way the chart's own resize (every chart sends {"autosize": true}
        # a moment after its first draw, and when the window changes): not a zoom, it must not cost the answer
        driver.execute_script("const g = document.querySelector('#memory-graph .js-plotly-plot');"
                              "Plotly.relayout(g, {'xaxis.range[0]': 1000, 'xaxis.range[1]': 1500});"
                              "setTimeout(() => Plotly.relayout(g, {autosize: true}), 300);")
        xs = wait_for(lambda: (lambda x: x if x and min(x) >= 999 and len(x) < 600 else None)(
            driver.execute_script(get_x)), timeout=15, what="zoomed range re-read at full detail")
        assert xs[0] == 1000 and xs[-1] == 1500
        assert "x0=1000" in driver.current_url and "x1=1500" in driver.current_url  # the address keeps the zoom
        driver.save_screenshot(str(artifacts / "run-page-zoomed.png"))
        assert severe_logs(driver) == []
    finally:
        stop()


def test_token_in_browser(driver: Any, served: tuple[str, Path]) -> None:
    """With --token the URL printed by serve works (token moves into a cookie); without it, nothing is served."""
    from gpudash.server.app import serve_in_thread

    _, root = served
    url, stop = serve_in_thread(root, "127.0.0.1", 0, token="t0ken")
    try:
        driver.delete_all_cookies()
        driver.get(url)
        wait_for(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), what="runs table with token")
        assert "token" not in driver.current_url
        driver.find_element("css selector", "#runs-table a.run-link").click()
        wait_for(lambda: rendered(driver, "memory-graph"), what="run page with token")
        driver.delete_all_cookies()
        driver.get(url.split("?")[0])
        assert "needs its token" in driver.find_element("tag name", "body").text
    finally:
        stop()
        driver.delete_all_cookies()
