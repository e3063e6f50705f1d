"""Memory verdicts without an OOM. The allocator columns are what the GPU
collectors record on CUDA; CI has no GPU, so a real CPU loop records those
columns with ``log_memory`` (numbers shaped like an H200 run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudash.analysis.memory import memory_verdicts

GiB = 2**30


def test_estimate_checked_per_step_and_at_the_estimators_micro_batch(recorded: Any) -> None:
    run = recorded("oom-recovered")  # adaptive micro-batch: 1, 2, 3, 4 ...
    v = {x.kind: x for x in memory_verdicts(run)}["estimate-check"]
    assert "predicted_peak_bytes" in run.memory and "median over steps" in v.title
    assert abs(v.numbers["error"]) < 0.3 and 0 <= v.numbers["share_within_10pct"] <= 1
    # without the trainer's per-step prediction: the run-level estimate, only where its micro-batch ran
    run.memory = run.memory.drop(columns=["predicted_peak_bytes"])
    v = {x.kind: x for x in memory_verdicts(run)}["estimate-check"]
    assert run.meta["estimate"]["micro_batch"] == 1 and "at that micro-batch" in v.evidence[0]
    assert abs(v.numbers["error"]) < 0.3


def test_fragmentation_headroom_and_other_processes_from_allocator_columns(tmp_path: Path) -> None:
    import torch

    import gpudash
    from gpudash.monitor import Monitor

    model = torch.nn.Linear(8, 2)
    with Monitor(tmp_path / "gpu-like", host_hz=0) as mon:
        for step in range(30):
            with mon.step(samples=4):
                with mon.phase("forward"):
                    model(torch.randn(4, 8)).sum().backward()
                mon.log_memory(allocated_bytes=60 * GiB, allocated_peak_bytes=(70 + step * 0.1) * GiB,
                               reserved_bytes=100 * GiB, inactive_split_bytes=40 * GiB,
                               alloc_retries=max(0, step - 20), device_total_bytes=140 * GiB,
                               non_pytorch_bytes=20 * GiB)
    kinds = {v.kind: v for v in memory_verdicts(gpudash.load_run(tmp_path / "gpu-like"))}
    frag = kinds["fragmentation"]
    assert frag.steps == (21, 21) and "expandable_segments" in (frag.recommendation or "")
    assert kinds["other-processes"].numbers["outside_bytes"] == 20 * GiB
    head = kinds["memory-headroom"]
    assert head.severity == "ok" and 0.5 < head.numbers["peak_share"] < 0.53
