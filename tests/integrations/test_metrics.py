"""Prometheus /metrics: scrape a live run over HTTP and parse the exposition format."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flask
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash import load_run
from gpudash.analysis.rates import RECENT_STEPS
from gpudash.server.metrics import MetricsServer, prometheus_name, register_metrics, serve_metrics


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.fixture
def live_run(tmp_path: Path, train_tiny: Callable[..., Any]) -> Any:
    runs = tmp_path / "runs"
    mon = train_tiny(runs / "exp1", steps=12, close=False, host_hz=20, handle_signals=False)
    # what the NVML collector writes on a GPU machine (no GPU here): one row per GPU per tick
    mon.recorder.put("device", {"time": time.time(), "gpu": 0, "power_w": 312.5, "util_pct": 87.0,
                                "pcie_tx_mib_s": 2.0, "temperature_c": 61.0})
    mon.event("oom", "CUDA out of memory (test)")
    time.sleep(0.1)  # let the host sampler write a row
    assert mon.flush()
    yield runs, mon
    mon.close()


def test_scrape_live_run_over_http(live_run: Any) -> None:
    runs, mon = live_run
    server = serve_metrics(runs, port=0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
    finally:
        server.shutdown()
    s = _samples(text)
    run = load_run(runs / "exp1")
    last = run.steps.iloc[-1]
    lab = {"run": "exp1", "rank": "0", "node": socket.gethostname()}
    assert _get(s, "gpudash_run_live", **lab) == 1.0
    assert _get(s, "gpudash_step", **lab) == 11
    assert _get(s, "gpudash_step_duration_seconds", **lab) == pytest.approx(last["duration_s"])
    assert _get(s, "gpudash_loss", **lab) == pytest.approx(last["loss"])
    assert _get(s, "gpudash_learning_rate", **lab) == pytest.approx(1e-2)
    assert _get(s, "gpudash_phase_duration_seconds", **lab, phase="forward") == pytest.approx(last["forward_s"])
    # tokens over wall time, from the window's first step's start to its last step's end (gpudash.analysis.rates):
    # the whole run here (12 steps), so the facts' rate, which the run-level gauge states
    tail = run.steps.tail(RECENT_STEPS)
    tokens_s = tail["tokens"].sum() / (tail["time"].max() - (tail["time"] - tail["duration_s"]).min())
    assert _get(s, "gpudash_tokens_per_second", **lab) == pytest.approx(tokens_s)
    assert _get(s, "gpudash_run_tokens_per_second", run="exp1") == pytest.approx(tokens_s)
    assert ("gpudash_run_mfu_ratio", frozenset({("run", "exp1")})) not in s  # a CPU run: no device peak
    mem = run.memory.iloc[-1]
    for cat in ("params", "grads", "optimizer"):
        assert _get(s, "gpudash_memory_category_bytes", **lab, category=cat) == mem[f"{cat}_bytes"]
    assert _get(s, "gpudash_device_power_watts", **lab, gpu="0") == 312.5
    assert _get(s, "gpudash_device_util_ratio", **lab, gpu="0") == pytest.approx(0.87)
    assert _get(s, "gpudash_device_pcie_tx_bytes_per_second", **lab, gpu="0") == 2 * 1024 * 1024
    assert _get(s, "gpudash_device_temperature_celsius", **lab, gpu="0") == 61.0
    assert _get(s, "gpudash_host_rss_bytes", **lab) > 0
    assert _get(s, "gpudash_events_total", **lab, kind="oom") == 1
    run.close()


def test_flask_route_and_stale_runs(live_run: Any, tmp_path: Path, train_tiny: Callable[..., Any]) -> None:
    runs, _ = live_run
    train_tiny(runs / "group" / "old", steps=2, host_hz=0, handle_signals=False)  # finished, nested one level
    app = flask.Flask("test")
    register_metrics(app, runs)
    resp = app.test_client().get("/metrics")
    assert resp.status_code == 200
    s = _samples(resp.get_data(as_text=True))
    assert _get(s, "gpudash_run_live", run="group/old", rank="0", node=socket.gethostname()) == 0.0
    assert _get(s, "gpudash_step", run="group/old", rank="0", node=socket.gethostname()) == 1
    strict = flask.Flask("strict")
    register_metrics(strict, runs, max_age_s=0.0)  # finished runs drop out at once
    s = _samples(strict.test_client().get("/metrics").get_data(as_text=True))
    runs_seen = {dict(labels).get("run") for _, labels in s}
    assert runs_seen == {"exp1"}


def test_prometheus_names_carry_base_units() -> None:
    assert prometheus_name("power_w") == ("power_watts", 1.0)
    assert prometheus_name("sm_active_pct") == ("sm_active_ratio", 0.01)
    assert prometheus_name("pcie_rx_mib_s") == ("pcie_rx_bytes_per_second", 1048576.0)
    assert prometheus_name("rss_bytes") == ("rss_bytes", 1.0)
    assert prometheus_name("sm_clock_mhz") == ("sm_clock_hertz", 1e6)


def test_monitor_serves_its_own_metrics(tmp_path: Path, train_tiny: Callable[..., Any]) -> None:
    exporter = MetricsServer(port=0)
    mon = train_tiny(tmp_path / "self", steps=4, close=False, host_hz=0, handle_signals=False)
    mon.add_collector(exporter)
    assert mon.flush() and exporter.url is not None
    with urllib.request.urlopen(exporter.url, timeout=10) as resp:
        s = _samples(resp.read().decode())
    assert _get(s, "gpudash_step", run="self", rank="0", node=socket.gethostname()) == 3
    mon.close()
    assert exporter.server is None  # stopped with the Monitor
