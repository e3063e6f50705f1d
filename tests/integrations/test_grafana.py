"""The shipped Grafana dashboard (deploy/grafana/gpudash.json) against a real /metrics scrape: every metric
and label its PromQL queries and variables use is one a two-node sample run exposes; ``promtool check
metrics`` (Debian's ``prometheus`` package) lints the scrape when installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.collectors.env import HOSTNAME_ENV
from gpudash.monitor import Monitor
from gpudash.server.metrics import serve_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "gpudash.json"
NODES = ("node-a", "node-b")


def _record_two_nodes(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks on two simulated hosts, with what a GPU run adds: the torch allocator's memory columns and
    NVML device rows (no GPU here: written as the collectors write them)."""
    pytest.importorskip("torch")
    from gpudash.testing import ToyLoop

    monitors, loops = [], []
    for rank, node in enumerate(NODES):
        monkeypatch.setenv(HOSTNAME_ENV, node)
        mon = Monitor(runs / "fleet", rank=rank, world_size=2, flush_interval=0.05, host_hz=0.0,
                      handle_signals=False)
        loop = ToyLoop(tokens_per_sample=8, seed=rank)
        mon.watch(loop.model, loop.opt)
        monitors.append(mon)
        loops.append(loop)
    for step in range(6):
        for rank, (mon, loop) in enumerate(zip(monitors, loops, strict=True)):
            with loop.step(mon) as s:
                mon.log(loss=s.loss, lr=1e-3)
            mon.recorder.put("memory", {"time": time.time(), "step": step, "allocated_bytes": 1e9 + rank,
                                        "reserved_bytes": 2e9})
            mon.recorder.put("device", {"time": time.time(), "gpu": 0, "power_w": 300.0 + rank,
                                        "util_pct": 90.0, "temperature_c": 60.0, "energy_j": 100.0 * step})
            # host memory by process as the host sampler writes it (collectors/procmem.py; pinned on CUDA)
            mon.recorder.put("host", {"time": time.time(), "step": step, "available_bytes": 5e10,
                                      "total_bytes": 6.4e10, "main_pss_bytes": 2e9, "children_pss_bytes": 4e9,
                                      "children": 4, "shm_used_bytes": 1e8, "pinned_bytes": 5e8})
    for mon in monitors:
        mon.close()


def _scrape(runs: Path) -> str:
    server = serve_metrics(runs, port=0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=30) as resp:
            return str(resp.read().decode())
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> str:
    mp = pytest.MonkeyPatch()
    try:
        runs = tmp_path_factory.mktemp("grafana") / "runs"
        _record_two_nodes(runs, mp)
    finally:
        mp.undo()
    return _scrape(runs)


def _queries(dash: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    out += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def _labels_by_metric(text: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def test_every_query_uses_metrics_and_labels_the_scrape_exposes(scrape: str) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exposed = _labels_by_metric(scrape)
    queries = _queries(dash)
    assert len(queries) >= 20
    used: set[str] = set()
    for q in queries:
        names = re.findall(r"\b(gpudash_[a-zA-Z0-9_]+)", q)
        assert names, q
        for name in names:
            assert name in exposed, f"{name} (in {q!r}) is not in the scrape"
        used.update(names)
        for name, matchers in re.findall(r"\b(gpudash_[a-zA-Z0-9_]+)\{([^}]*)\}", q):
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers):
                assert label in exposed[name], f"{name} has no label {label!r} ({q!r})"
        union = set().union(*(exposed[n] for n in names))
        for group in re.findall(r"\bby \(([^)]*)\)", q):
            for label in (g.strip() for g in group.split(",")):
                assert label in union, f"by ({label}) in {q!r}: no such label"
        m = re.fullmatch(r"label_values\((gpudash_\w+)(?:\{[^}]*\})?, (\w+)\)", q)
        if q.startswith("label_values"):
            assert m is not None and m.group(2) in exposed[m.group(1)], q
    # the fleet's axes: the node label holds each rank's host, and the node/rank panels have data
    nodes = {s.labels["node"] for f in text_string_to_metric_families(scrape) for s in f.samples
             if s.name == "gpudash_step_duration_seconds"}
    assert nodes == set(NODES)
    assert {"gpudash_device_power_watts", "gpudash_memory_allocated_bytes", "gpudash_phase_duration_seconds",
            "gpudash_step_skew_ratio", "gpudash_ooms_total", "gpudash_host_main_pss_bytes",
            "gpudash_host_children_pss_bytes", "gpudash_host_pinned_bytes", "gpudash_run_gpu_energy_joules_total",
            "gpudash_run_rank_energy_joules_total"} <= used


def test_dashboard_is_provisionable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert list(variables) == ["datasource", "run", "node", "rank"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("run", "node", "rank"):
        assert variables[name]["multi"] and variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        for t in p["targets"]:  # a selector that filters by node/rank also honours the run variable
            if "$node" in t["expr"] or "$rank" in t["expr"]:
                assert "$run" in t["expr"]
    provider = (DASHBOARD.parent / "provisioning" / "dashboards" / "gpudash.yaml").read_text()
    assert "type: file" in provider and "path:" in provider


def test_promtool_accepts_the_scrape(scrape: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    proc = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
