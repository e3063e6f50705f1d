"""``gpudash report``: the HTML opens offline in a real browser and shows the verdicts."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.browser import make_driver, need_chromium

from gpudash.analysis import summarize
from gpudash.cli import main
from gpudash.report import render_html, render_markdown


def test_html_is_self_contained(recorded: Any) -> None:
    run = recorded("oom-recovered")
    page = render_html(run)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower()
    assert page.count("<svg") >= 3  # step time, loss, memory
    assert '<ol id="actions">' in page and "--ckpt block" in page
    shown = html.unescape(re.sub(r"<[^>]*>", "", page))  # the page's text, however the template escapes it
    for v in summarize(run):
        assert v.title in shown


def test_names_and_messages_are_escaped(tmp_path: Path) -> None:
    import torch

    import gpudash
    from gpudash.monitor import Monitor

    evil = '<script>alert("x")</script>'
    with Monitor(tmp_path / "evil", name=evil, host_hz=0) as mon:
        for _ in range(3):
            with mon.step(samples=1):
                with mon.phase("forward"):
                    torch.ones(4).sum()
        mon.event("oom", evil, requested_bytes=1)
    page = render_html(gpudash.load_run(tmp_path / "evil"))
    assert "<script" not in page and "&lt;script&gt;" in page


def test_cli_html_and_markdown(recorded: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = recorded("input-bound")
    out = tmp_path / "r.html"
    assert main(["report", str(run.path), "-o", str(out), "--price-per-hour", "3.5"]) == 0
    page = out.read_text()
    assert "Input-bound" in page and "a CPU run: no GPU price" in page and "$/GPU-hour" not in page
    run.meta["device"] = "cuda:0"
    assert "3.50 $/GPU-hour" in render_html(run, price_per_hour=3.5)  # a GPU run's report says its price
    capsys.readouterr()
    assert main(["report", str(run.path), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "# gpudash report: input-bound" in md and "Input-bound" in md and "**Do:**" in md
    assert render_markdown(run).splitlines()[0] == md.splitlines()[0]


def test_cli_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.browser
def test_report_opens_in_headless_chromium_without_errors(recorded: Any, tmp_path: Path) -> None:
    need_chromium()
    from selenium.webdriver.common.by import By

    run = recorded("oom-crash")
    page = tmp_path / "report.html"
    assert main(["report", str(run.path), "-o", str(page)]) == 0
    driver = make_driver()
    try:
        driver.get(page.as_uri())
        cards = driver.find_elements(By.CSS_SELECTOR, "#verdicts .verdict")
        titles = [c.find_element(By.TAG_NAME, "h3").text for c in cards]
        assert any("Died of OOM" in t for t in titles)
        assert cards[0].get_attribute("data-kind") in ("status", "oom:did not fit")
        assert len(driver.find_elements(By.CSS_SELECTOR, "figure svg")) >= 2
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == []
        resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        assert [r for r in resources if not r.startswith("file:")] == []
    finally:
        driver.quit()


def test_device_telemetry_gets_a_figure(tmp_path: Path) -> None:
    import time

    import gpudash
    from gpudash.monitor import Monitor

    # NVML-shaped rows as the device collector writes them (no GPU in CI)
    with Monitor(tmp_path / "dev", host_hz=0) as mon:
        for i in range(20):
            with mon.step(samples=1):
                with mon.phase("forward"):
                    time.sleep(0.002)
            mon.recorder.put("device", {"time": time.time(), "gpu": 0, "sm_active_pct": 40.0 + i,
                                        "gpu_util_pct": 90.0})
    page = render_html(gpudash.load_run(tmp_path / "dev"))
    assert "GPU activity (%)" in page and page.count("<svg") >= 2
