"""What the browser tests share: waiting for a condition, the page's severe console lines, a chart drawn."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["full_screenshot", "rendered", "severe_logs", "wait_for"]


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
