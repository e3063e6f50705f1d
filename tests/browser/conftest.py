"""Real headless Chromium (Debian's chromium + chromedriver) driving a real dashboard server."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def make_driver(width: int = 1400, height: int = 1000):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    if not (Path(CHROMIUM).exists() and (Path(CHROMEDRIVER).exists() or shutil.which("chromedriver"))):
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    d = make_driver()
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS




@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A dashboard on a free loopback port over two finished runs (``rich`` and ``plain``)."""
    from helpers.runmaker import HOSTILE, train

    from gpudash.server.app import serve_in_thread

    root = tmp_path_factory.mktemp("browser-runs")
    train(root / "rich", 40, rich=True, name=f"rich {HOSTILE}")
    train(root / "plain", 30)
    url, stop = serve_in_thread(root, "127.0.0.1", 0)
    try:
        yield url, root
    finally:
        stop()
