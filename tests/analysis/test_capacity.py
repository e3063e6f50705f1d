"""One capacity for a run, on every surface (issue 47): under ``--memory-cap-gb`` the live leak watch, the
whole-run leak fact, the headroom verdict, the report's line and the dashboard's memory chart all judge
against the cap, never one of them against the device's total memory."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pandas as pd

from gpudash import load_run
from gpudash.analysis.capacity import Capacity, capacity, capacity_bytes
from gpudash.analysis.leak import recorded_leaks, run_leak
from gpudash.analysis.memory import memory_verdicts
from gpudash.monitor import Monitor
from gpudash.server.layouts.memory import capacity_lines
from gpudash.units import GiB, MiB

PKG = Path(__file__).resolve().parents[2] / "gpudash"
CAP = {"capacity_bytes": 8 * GiB, "capacity_source": "--memory-cap-gb 8 (set_per_process_memory_fraction)"}


def test_the_order_a_capacity_is_taken_in() -> None:
    device = pd.DataFrame({"device_total_bytes": [80 * GiB, None]})
    assert capacity({"preflight": CAP}, device) == Capacity(8 * GiB, "memory cap")
    assert capacity({"preflight": {"capacity_bytes": GiB, "capacity_source": "--memory-budget-gb 1"}}) == (
        Capacity(GiB, "budget"))
    assert capacity({"preflight": {"capacity_bytes": 80 * GiB, "capacity_source": "device total memory"}}) == (
        Capacity(80 * GiB, "device"))
    # no pre-flight (a Monitor in the user's own loop): the cap its config names, then the device
    assert capacity({"config": {"memory_cap_gb": 8}}, device) == Capacity(8 * GiB, "memory cap")
    assert capacity({}, device) == Capacity(80 * GiB, "device")
    assert capacity({"device_capacity_bytes": 24 * GiB}) == Capacity(24 * GiB, "device")
    assert capacity({"config": {"memory_budget_gb": 0.5}}) == Capacity(GiB / 2, "budget")
    assert capacity({"memory_budget_bytes": 1000}) == Capacity(1000, "budget")
    assert capacity({"preflight": {"capacity_bytes": "bad"}, "config": "x"}) is None
    assert capacity_bytes({}, pd.DataFrame()) is None


def test_under_a_memory_cap_the_live_leak_watch_and_every_whole_run_fact_use_the_cap(tmp_path: Path) -> None:
    steps = 300
    with Monitor(tmp_path / "r", host_hz=0, leak_poll_s=0.05, config={"memory_cap_gb": 8}) as m:
        m.set_meta(preflight=CAP)
        for i in range(steps):
            with m.step():  # 2 GiB held, growing 1 MiB a step, on an 80 GiB card capped at 8 GiB
                m.log_memory(allocated_bytes=2 * GiB + i * MiB, device_total_bytes=80 * GiB)
            if i % 20 == 0:
                m.flush(5.0)
                time.sleep(0.2)
    run = load_run(tmp_path / "r")
    try:
        assert capacity_bytes(run) == 8 * GiB
        live = recorded_leaks(run)
        assert live, "the watch found no leak"
        whole = run_leak(run)
        assert whole is not None
        assert live[0].limit_bytes == whole.limit_bytes == 8 * GiB  # the watch's and the fact's capacity
        headroom = next(v for v in memory_verdicts(run) if v.kind == "memory-headroom")
        assert headroom.numbers["capacity_bytes"] == 8 * GiB
        assert ("memory cap", 8 * GiB, "dot") in capacity_lines(run.meta)
    finally:
        run.close()


def test_no_other_module_decides_a_capacity() -> None:
    """The keys a capacity is decided from are read in analysis/capacity.py only, on every surface that judges
    against one (the collectors and the trainer write them; an OOM event's own limit, as torch printed it, is
    analysis/oom.py's)."""
    keys = {"memory_cap_gb", "memory_budget_gb", "memory_budget_bytes", "capacity_source", "device_total_bytes"}
    own = {"analysis/capacity.py": keys, "analysis/oom.py": {"memory_budget_bytes", "device_total_bytes"}}
    bad = []
    for layer in ("analysis", "server", "report", "monitor", "alerts"):
        for path in sorted((PKG / layer).rglob("*.py")):
            rel = str(path.relative_to(PKG))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in keys - own.get(rel, set()):
                    bad.append(f"{rel}:{node.lineno} {node.value}")
    assert bad == [], "take a run's capacity from gpudash.analysis.capacity: " + ", ".join(bad)
