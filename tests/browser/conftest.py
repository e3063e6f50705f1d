"""Real headless Chromium (Debian's chromium + chromedriver) driving a real dashboard server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.browser import chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    yield from chromium()


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
