"""Bottleneck stretches on runs slowed for real."""

from __future__ import annotations

from typing import Any

from gpudash.analysis.bottleneck import bottleneck_verdicts, phase_shares, stretches


def _by_kind(run: Any) -> dict[str, Any]:
    return {v.kind: v for v in bottleneck_verdicts(run)}


def test_slow_data_phase_is_input_bound(recorded: Any) -> None:
    run = recorded("input-bound")  # the trainer with --slow-data-ms
    v = _by_kind(run)["input-bound"]
    assert v.severity in ("warn", "bad")
    assert v.numbers["share_of_step"] > 0.4
    assert any("data" in e and "%" in e for e in v.evidence)
    from gpudash.analysis import summarize

    rec = next(x for x in summarize(run) if x.kind == "input-bound")
    assert "num_workers" in (rec.recommendation or "") and "median step" in (rec.saving or "")


def test_healthy_run_is_compute_bound_and_logged_timings_are_not_phases(recorded: Any) -> None:
    run = recorded("healthy")
    assert "thread_cpu_s" in run.steps  # the trainer logs it; it is CPU time, not a phase
    kinds = _by_kind(run)
    assert set(kinds) == {"compute-bound"} and kinds["compute-bound"].severity == "ok"
    shares = phase_shares(run.steps)
    assert float(shares[["input", "compute", "offload", "sync"]].sum(axis=1).max()) < 1.05


def test_host_copies_are_offload_bound(recorded: Any) -> None:
    run = recorded("loop-offload", loop={"steps": 30, "offload_mb": 48})
    assert "host-offload-bound" in _by_kind(run)


def test_barrier_wait_outside_phases_is_synchronization_bound(recorded: Any) -> None:
    run = recorded("loop-barrier", loop={"steps": 30, "barrier_wait_ms": 40})
    v = _by_kind(run)["synchronization-bound"]
    assert v.numbers["share_of_step"] > 0.3


def test_a_slow_stretch_in_the_middle_is_its_own_stretch(tmp_path: Any) -> None:
    import time

    import gpudash
    from gpudash.monitor import Monitor

    with Monitor(tmp_path / "mid", host_hz=0) as mon:
        for step in range(90):
            with mon.step(samples=1):
                with mon.phase("data"):
                    if 30 <= step < 60:
                        time.sleep(0.01)
                with mon.phase("forward"):
                    sum(i * i for i in range(20000))
    found = stretches(gpudash.load_run(tmp_path / "mid"))
    inp = [s for s in found if s.kind == "input-bound"]
    assert len(inp) == 1 and abs(inp[0].first_step - 30) <= 3 and abs(inp[0].last_step - 59) <= 3


def test_input_bound_evidence_cites_low_sm_activity(tmp_path: Any) -> None:
    import time

    import gpudash
    from gpudash.monitor import Monitor

    # device rows shaped like the NVML collector's (no GPU in CI): SM idle while the loop waits for data
    with Monitor(tmp_path / "sm", host_hz=0) as mon:
        for _ in range(30):
            with mon.step(samples=1):
                with mon.phase("data"):
                    time.sleep(0.01)
                with mon.phase("forward"):
                    sum(i * i for i in range(5000))
            mon.recorder.put("device", {"time": time.time(), "gpu": 0, "sm_active_pct": 8.0, "gpu_util_pct": 15.0})
    v = _by_kind(gpudash.load_run(tmp_path / "sm"))["input-bound"]
    assert any("SM activity low (8 %)" in e for e in v.evidence)


def test_cuda_event_columns_are_evidence_not_phases(tmp_path: Any) -> None:
    import gpudash
    from gpudash.analysis.bottleneck import phase_columns
    from gpudash.monitor import Monitor

    # the CUDA timer's columns (gpu_s, <phase>_gpu_s) as it writes them on a GPU
    with Monitor(tmp_path / "gpu-times", host_hz=0) as mon:
        for _ in range(20):
            with mon.step(samples=1):
                with mon.phase("forward"):
                    sum(i * i for i in range(20000))
                mon.log(gpu_s=0.5, forward_gpu_s=0.4)
    run = gpudash.load_run(tmp_path / "gpu-times")
    assert phase_columns(run.steps) == ["forward_s"]
    (s,) = stretches(run)
    assert s.kind == "compute-bound" and s.device["gpu_busy_share"] > 1.0  # GPU time vs a CPU-timed step
