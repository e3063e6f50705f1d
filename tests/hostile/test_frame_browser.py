"""The frame-ancestors policy in a real browser (issue 26): a notebook page on this machine embeds the
dashboard (gpudash.server.notebook's IFrame at 127.0.0.1), a page of another origin cannot."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.browser import chromium
from helpers.hostile_cases import healthy

from gpudash.server.app import serve_in_thread

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    yield from chromium(1200, 900)


def _parent_page(host: str, iframe_src: str) -> tuple[str, http.server.ThreadingHTTPServer]:
    """A page on ``host`` that frames ``iframe_src``, as a notebook's output cell does."""
    body = f'<html><body><iframe id="dash" src="{iframe_src}" width="1000" height="700"></iframe></body></html>'

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://{host}:{server.server_address[1]}/", server


def _framed_run_name(driver: object, page: str, wait_s: float) -> str | None:
    from selenium.webdriver.common.by import By

    driver.get(page)  # type: ignore[attr-defined]
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        driver.switch_to.default_content()  # type: ignore[attr-defined]
        driver.switch_to.frame(driver.find_element(By.ID, "dash"))  # type: ignore[attr-defined]
        found = driver.find_elements(By.ID, "run-name")  # type: ignore[attr-defined]
        if found and found[0].text:
            return str(found[0].text)
        time.sleep(0.3)
    return None


def test_local_notebook_page_frames_the_dashboard_another_origin_cannot(tmp_path: Path, driver: object) -> None:
    healthy(tmp_path / "runs" / "framed")
    url, stop = serve_in_thread(tmp_path / "runs", "127.0.0.1", 0)
    servers = []
    try:
        local, s1 = _parent_page("127.0.0.1", url + "run/framed")
        other, s2 = _parent_page("127.0.0.2", url + "run/framed")  # another origin (loopback, not allowed)
        servers += [s1, s2]
        assert _framed_run_name(driver, local, 60) == "framed"
        assert _framed_run_name(driver, other, 5) is None
    finally:
        for s in servers:
            s.shutdown()
        stop()
