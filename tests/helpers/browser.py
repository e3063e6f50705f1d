"""What the browser tests share: a headless Chromium (Debian's chromium + chromedriver), waiting for a
condition, the page's severe console lines, a chart drawn."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "chromium", "full_screenshot", "make_driver", "need_chromium", "rendered", "severe_logs",
           "wait_for"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def need_chromium() -> None:
    """Skip the calling test where Chromium and its driver are not installed."""
    import pytest  # the benchmarks drive Chromium too, outside pytest

    if not (Path(CHROMIUM).exists() and (Path(CHROMEDRIVER).exists() or shutil.which("chromedriver"))):
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")


def make_driver(width: int = 1400, height: int = 1000, *extra: str) -> Any:
    """A headless Chromium (its console kept for :func:`severe_logs`); ``extra``: more command-line switches."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", *extra):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER if Path(CHROMEDRIVER).exists()
                                            else shutil.which("chromedriver")), options=opts)


def chromium(width: int = 1400, height: int = 1000, *extra: str) -> Iterator[Any]:
    """The body of a ``driver`` fixture: skip without Chromium, else a driver, quit afterwards
    (``yield from chromium()``)."""
    need_chromium()
    d = make_driver(width, height, *extra)
    try:
        yield d
    finally:
        d.quit()


def wait_for(fn: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.time() + timeout
    last: Any = None
    while time.time() < deadline:
        try:
            last = fn()
        except Exception:  # noqa: BLE001 - the page is still rendering
            last = None
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def severe_logs(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def rendered(driver: Any, graph_id: str) -> bool:
    """``graph_id`` drawn with its data; scrolled to first (a chart below the fold is drawn when in view)."""
    return bool(driver.execute_script(
        "const g = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
        "if (g && g.layout && g.layout.meta === 'gpudash-lazy') { g.scrollIntoView({block: 'center'}); }"
        "return !!(g && g._fullLayout && g.querySelector('.main-svg') && g.layout.meta !== 'gpudash-lazy');",
        graph_id))


def full_screenshot(driver: Any, path: Path) -> None:
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1400, min(int(height) + 40, 8000))
    time.sleep(0.8)
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
