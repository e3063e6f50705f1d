"""The GPU collectors on a real GPU (skipped without one; issue 7 runs them on an H200)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import gpudash
from gpudash.collectors.oom import record_oom
from gpudash.monitor import Monitor
from gpudash.store.oom_message import parse_oom_message
from gpudash.store.schema import SNAPSHOT_REQUEST_FILE

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def cuda_loop(m: Monitor, steps: int, on_step: object = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    m.watch(model, opt)
    for i in range(steps):
        with m.step(samples=64):
            with m.phase("forward"):
                loss = model(torch.randn(64, 512, device="cuda")).square().mean()
            with m.phase("backward"):
                loss.backward()
            with m.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if callable(on_step):
            on_step(i)


def test_all_collectors_on_a_gpu(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"

    def request(i: int) -> None:
        if i == 5:
            (run_dir / SNAPSHOT_REQUEST_FILE).write_text("")
        time.sleep(0.05)

    with Monitor(run_dir, device_hz=20) as m:
        cuda_loop(m, 40, request)
    run = gpudash.load_run(run_dir)
    kinds = run.events["kind"].tolist()
    unavailable = [d["source"] for k, d in zip(kinds, run.events["data"], strict=True) if k == "collector_unavailable"]
    assert not {"allocator", "snapshots", "cuda_timing"} & set(unavailable), unavailable
    mem = run.memory
    for c in ("allocated_bytes", "reserved_bytes", "allocated_peak_bytes", "device_used_bytes", "other_bytes"):
        assert c in mem, c
    assert (mem["reserved_bytes"] >= mem["allocated_bytes"]).all()
    assert (mem["allocated_peak_bytes"] >= mem["allocated_bytes"]).all()
    steps = run.steps
    assert len(steps) == 40 and steps["gpu_s"].notna().all()
    assert (steps["forward_gpu_s"] > 0).all()
    if "device" not in unavailable:
        dev = run.device
        assert len(dev) > 0 and {"power_w", "sm_clock_mhz", "memory_used_bytes"} <= set(dev.columns)
        if "processes" in dev:  # NVML sees this process's memory on the mapped GPU (under a host pid
            # in a container, where the pid namespace differs: then it counts as "other")
            seen = dev["process_memory_bytes"].fillna(0) + dev["other_processes_memory_bytes"].fillna(0)
            assert seen.max() > 0
    # the dashboard's request, once; the leak watch may ask for its "before" (step >= 20), stored as its own
    reasons = [mm.reason for mm in run.snapshots]
    assert reasons.count("requested") == 1 and set(reasons) <= {"requested", "leak watch"}, reasons
    assert run.snapshots[0].allocated_bytes > 0


def test_oom_is_recorded_with_numbers_and_a_snapshot(tmp_path: Path) -> None:
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    with Monitor(tmp_path / "r", device_hz=0) as m:
        cuda_loop(m, 2)
        with pytest.raises(torch.OutOfMemoryError) as ei:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        parsed = record_oom(m, ei.value)
    assert parsed["requested_bytes"] == pytest.approx(2 * total, rel=0.01)
    assert parse_oom_message(str(ei.value)).format == "current"
    run = gpudash.load_run(tmp_path / "r")
    ooms = run.events[run.events["kind"] == "oom"]
    assert len(ooms) == 1 and ooms.iloc[0]["data"]["source"] == "allocator_observer"
    assert ooms.iloc[0]["data"]["requested_bytes"] >= 2 * total
    assert [mm.reason for mm in run.snapshots] == ["oom"]
