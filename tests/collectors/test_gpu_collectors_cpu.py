"""On a machine without a GPU every GPU collector says so once and training goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.collectors import default_collectors
from gpudash.options import MonitorOptions

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")

GPU_SOURCES = ("allocator", "snapshots", "device", "cuda_timing")


def test_all_gpu_collectors_unavailable_once_and_loop_unaffected(tmp_path: Path, train_tiny: Any) -> None:
    train_tiny(tmp_path / "r", steps=12)
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "finished"
    assert run.steps["step"].tolist() == list(range(12))
    assert {"forward_s", "backward_s", "loss"} <= set(run.steps.columns)
    assert not any(c.endswith("_gpu_s") for c in run.steps.columns)
    ev = run.events[run.events["kind"] == "collector_unavailable"]
    sources = [d["source"] for d in ev["data"]]
    for s in GPU_SOURCES:
        assert sources.count(s) == 1, (s, sources)
    assert "stacks" not in sources  # off by default: nothing to report
    for s in GPU_SOURCES:
        assert run.meta[f"unavailable_{s}"]
    assert len(run.device) == 0 and run.snapshots == []
    assert "params_bytes" in run.memory and "allocated_bytes" not in run.memory


def test_switched_off_collectors_say_nothing(tmp_path: Path, train_tiny: Any) -> None:
    train_tiny(tmp_path / "r", steps=3, allocator=False, device_hz=0, cuda_timing=False)
    ev = gpudash.load_run(tmp_path / "r").events
    sources = [d["source"] for d in ev.loc[ev["kind"] == "collector_unavailable", "data"]]
    # the OOM observer/snapshots have no switch of their own; the host collector (on) says once where the
    # machine's RAPL energy counters cannot be read, and that there is no pinned memory without CUDA
    assert [s for s in sources if s not in ("cpu_energy", "pinned_memory")] == ["snapshots"]
    assert sources.count("pinned_memory") <= 1


def test_default_collectors_follow_options() -> None:
    names = [c.name for c in default_collectors(MonitorOptions())]
    assert names == ["host", "allocator", "snapshots", "device", "cuda_timing"]
    names = [c.name for c in default_collectors(MonitorOptions(host_hz=0, allocator=False, device_hz=0,
                                                               cuda_timing=False, stacks_hz=5))]
    assert names == ["snapshots", "stacks"]
