"""The view habits in real Chromium: progress and ETA moving on a live run, the theme and the x axis kept in
the address, the device panel's reason on this machine without a GPU."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import rendered, severe_logs, wait_for

pytestmark = pytest.mark.browser


def _text(driver: Any, element_id: str) -> str:
    found = driver.find_elements("id", element_id)
    return found[0].text if found else ""


def test_progress_and_eta_move_on_a_live_run(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    from helpers.runmaker import LiveRun

    url, root = served
    with LiveRun(root / "progressing", delay=0.05, name="progressing", total_steps=100_000):
        time.sleep(1.0)
        driver.get(url + "run/progressing")
        wait_for(lambda: rendered(driver, "step-time-graph"), what="step-time graph")
        driver.execute_script("window.__gpudashNoReload = 1;")
        pattern = re.compile(r"^step ([\d,]+) of 100,000 · ETA \d")
        first = wait_for(lambda: pattern.match(_text(driver, "progress-text")), what="progress and ETA")
        done = int(first.group(1).replace(",", ""))
        wait_for(lambda: (m := pattern.match(_text(driver, "progress-text"))) and int(m.group(1).replace(",", ""))
                 > done, what="progress moving with the live tick")
        width = driver.execute_script("return document.querySelector('#run-progress .progress-fill').style.width")
        assert width.endswith("%")
        assert driver.execute_script("return window.__gpudashNoReload") == 1
        driver.save_screenshot(str(artifacts / "run-page-progress.png"))
        driver.get(url)
        cell = wait_for(lambda: [c.text for c in driver.find_elements(
            "css selector", "#runs-table tr[id*='progressing'] td.progress-cell") if "ETA" in c.text],
            what="progress and ETA in the runs list")
        assert re.match(r"^\d+ % · ETA \d", cell[0]), cell
    assert severe_logs(driver) == []


def test_device_reason_while_live_without_gpu(driver: Any, served: tuple[str, Path]) -> None:
    """This machine has no GPU: the live run's device panel says what the collector noted, not 'waiting'."""
    from helpers.runmaker import LiveRun

    from gpudash.store.run import load_run

    url, root = served
    with LiveRun(root / "nogpu", delay=0.05, name="nogpu"):
        wait_for(lambda: load_run(root / "nogpu").meta.get("unavailable_device"), what="the collector's note")
        noted = str(load_run(root / "nogpu").meta["unavailable_device"])
        driver.get(url + "run/nogpu")
        reason = wait_for(lambda: _text(driver, "device-graph-reason"), what="device reason")
        assert driver.find_element("id", "run-status").text == "live"
        assert noted in reason and "waiting" not in reason
    assert severe_logs(driver) == []


def _dark(driver: Any) -> bool:
    return bool(driver.execute_script("return document.body.classList.contains('dark')"))


def test_theme_toggle_goes_into_the_address(driver: Any, served: tuple[str, Path]) -> None:
    url, _ = served
    driver.execute_script("try { localStorage.removeItem('gpudash-theme'); } catch (e) {}")
    try:
        driver.get(url + "run/rich?cursor=5")
        wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph")
        was_dark = _dark(driver)
        driver.find_element("id", "theme-toggle").click()
        want = "light" if was_dark else "dark"
        wait_for(lambda: f"theme={want}" in driver.current_url, what="theme in the address")
        assert "cursor=5" in driver.current_url and _dark(driver) == (want == "dark")
        link = driver.current_url
        driver.execute_script("try { localStorage.removeItem('gpudash-theme'); } catch (e) {}")  # the link alone
        driver.get("about:blank")
        driver.get(link)
        wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph from the link")
        assert _dark(driver) == (want == "dark")
        driver.find_element("id", "theme-toggle").click()  # and back: the address follows
        back = "dark" if want == "light" else "light"
        wait_for(lambda: f"theme={back}" in driver.current_url, what="theme toggled back in the address")
        assert _dark(driver) == (back == "dark")
        driver.get(url)  # the runs list keeps its page, the address names the theme
        wait_for(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), what="runs table")
        driver.find_element("id", "theme-toggle").click()
        wait_for(lambda: "theme=" in driver.current_url, what="theme in the runs list's address")
        assert driver.find_elements("css selector", "#runs-table tbody tr")
        assert severe_logs(driver) == []
    finally:
        driver.execute_script("try { localStorage.removeItem('gpudash-theme'); } catch (e) {}")


def test_links_work_under_a_proxy_prefix(driver: Any, served: tuple[str, Path]) -> None:
    """The app served under a prefix (as behind Jupyter's proxy): the runs list's link, the run page's
    '← all runs' and back, all without leaving the prefix."""
    from gpudash.server.app import serve_in_thread

    _, root = served
    url, stop = serve_in_thread(root, "127.0.0.1", 0, prefix_for_port=lambda port: f"/user/alice/proxy/{port}/")
    try:
        base = url.rstrip("/") + f"/user/alice/proxy/{url.rstrip('/').rsplit(':', 1)[1]}/"
        driver.get(base)
        link = wait_for(lambda: [a for a in driver.find_elements("css selector", "#runs-table a.run-link")
                                 if a.get_attribute("href").endswith("/run/rich")], what="run link")
        assert link[0].get_attribute("href") == base + "run/rich"
        link[0].click()
        wait_for(lambda: rendered(driver, "memory-graph"), what="run page under the prefix")
        assert driver.current_url.startswith(base + "run/rich")
        driver.find_element("link text", "← all runs").click()
        wait_for(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), what="runs list again")
        assert driver.current_url == base
        assert severe_logs(driver) == []
    finally:
        driver.get("about:blank")
        stop()


_LAYOUT = ("const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
           "return g ? {type: g._fullLayout.xaxis.type, range: g._fullLayout.xaxis.range, x: g.data[0].x,"
           " shape: (g.layout.shapes || [])[0] || null,"
           " ticks: Array.from(g.querySelectorAll('.xtick text')).map(e => e.textContent)} : null;")


def _axis(driver: Any, graph_id: str) -> dict[str, Any]:
    return driver.execute_script(_LAYOUT, graph_id) or {}


def _pick_x(driver: Any, mode: str) -> None:
    driver.find_element("css selector", f"#x-mode input[value='{mode}']").click()


def test_x_axis_switch_round_trip_and_zoom(driver: Any, served: tuple[str, Path], artifacts: Path) -> None:
    """step -> relative time (h:mm:ss ticks) -> a zoom (kept in steps in the address) -> the link reopens the
    same axis and range -> wall time (dates) -> back to steps."""
    url, _ = served
    driver.get(url + "run/rich?cursor=20")
    wait_for(lambda: rendered(driver, "loss-graph"), what="loss graph")
    assert _axis(driver, "loss-graph")["type"] == "linear"
    _pick_x(driver, "relative")
    wait_for(lambda: "x=relative" in driver.current_url, what="x=relative in the address")
    for g in ("loss-graph", "memory-graph", "step-time-graph", "rates-graph", "phases-graph", "signals-graph"):
        wait_for(lambda g=g: _axis(driver, g).get("type") == "date", what=f"{g} on a time axis")
    rel = _axis(driver, "loss-graph")
    ticks = [t for t in rel["ticks"] if t]
    assert ticks and all(re.fullmatch(r"\d+:\d\d:\d\d(\.\d{3})?", t) for t in ticks), ticks  # h:mm:ss(.ms)
    assert len(set(ticks)) == len(ticks), ticks  # a sub-second run: every tick tells its time apart
    assert 0 <= float(rel["x"][0]) < 3_600_000  # ms since the first step began, on 1970-01-01
    xs = [float(v) for v in rel["x"]]
    assert len(xs) == 40
    line = _axis(driver, "loss-graph")["shape"]
    assert abs(datetime_ms(line["x0"]) - xs[20]) < 1.0, (line, xs[20])  # the cursor line at step 20's time
    lo, hi = xs[5], xs[25]  # zoom onto steps 5..25 by their times
    for _ in range(3):  # the graph binds its relayout handler a moment after the first draw
        driver.execute_script("Plotly.relayout(document.querySelector('#loss-graph .js-plotly-plot'), "
                              "{'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});", lo, hi)
        try:
            wait_for(lambda: "x0=" in driver.current_url, timeout=5, what="zoom in the address")
            break
        except AssertionError:
            continue
    link = driver.current_url
    q = dict(p.split("=", 1) for p in link.split("?", 1)[1].split("&"))
    assert q["x"] == "relative" and (float(q["x0"]), float(q["x1"])) == (5.0, 25.0), link  # steps, not times
    driver.get("about:blank")
    driver.get(link)
    wait_for(lambda: rendered(driver, "memory-graph"), what="memory graph from the link")
    assert driver.find_element("css selector", "#x-mode input[value='relative']").is_selected()
    again = _axis(driver, "memory-graph")
    assert again["type"] == "date"
    drawn = [datetime_ms(v) for v in again["range"]]
    assert abs(drawn[0] - lo) < 1000 and abs(drawn[1] - hi) < 1000, (drawn, lo, hi)
    _pick_x(driver, "wall")
    wait_for(lambda: "x=wall" in driver.current_url, what="x=wall in the address")
    wait_for(lambda: float(_axis(driver, "loss-graph")["x"][0]) > 1e12, what="wall clock x (ms since 1970)")
    driver.save_screenshot(str(artifacts / "run-page-wall-time.png"))
    _pick_x(driver, "step")
    wait_for(lambda: "x=" not in driver.current_url.replace("x0=", "").replace("x1=", ""), what="x= gone")
    wait_for(lambda: _axis(driver, "loss-graph").get("type") == "linear", what="back to steps")
    assert [round(v) for v in _axis(driver, "memory-graph")["range"]] == [5, 25]  # the zoom, in steps again
    assert severe_logs(driver) == []


def datetime_ms(value: Any) -> float:
    """A date axis value as plotly reports it ("1970-01-01 00:00:01.5") in ms since 1970 (UTC)."""
    from datetime import datetime, timezone

    if isinstance(value, int | float):
        return float(value)
    return datetime.fromisoformat(str(value).replace(" ", "T")).replace(tzinfo=timezone.utc).timestamp() * 1000


def test_x_axis_time_mode_keeps_growing_live(driver: Any, served: tuple[str, Path]) -> None:
    from helpers.runmaker import LiveRun

    url, root = served
    with LiveRun(root / "timed", delay=0.05, name="timed"):
        time.sleep(1.0)
        driver.get(url + "run/timed?x=relative")
        wait_for(lambda: rendered(driver, "step-time-graph"), what="step-time graph")
        first = _axis(driver, "step-time-graph")
        assert first["type"] == "date"
        n0, last0 = len(first["x"]), float(first["x"][-1])
        wait_for(lambda: len(_axis(driver, "step-time-graph")["x"]) > n0 + 5, what="live points appended")
        grown = [float(v) for v in _axis(driver, "step-time-graph")["x"]]
        assert grown[-1] > last0 and grown == sorted(grown)  # appended in the same units, in time order
        assert grown[-1] < 3_600_000  # relative ms, not steps and not epoch times
    assert severe_logs(driver) == []
