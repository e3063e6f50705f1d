"""The one judge: facts derived once from a run (phases, OOMs counted once, peaks, JSON safety)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpudash.analysis.facts import oom_count, run_facts
from gpudash.analysis.phases import KNOWN_PHASES, run_phases
from gpudash.server.runcache import RunCache
from gpudash.store.run import Run


def _run(steps: dict[str, Any] | None = None, memory: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None,
         meta: dict[str, Any] | None = None, status: str = "finished") -> Run:
    return Run(path=Path("."), meta=meta or {}, status=status, steps=pd.DataFrame(steps or {}),
               memory=pd.DataFrame(memory or {}), events=pd.DataFrame(events or []))


def test_phases_are_what_was_opened_else_the_known_names() -> None:
    cols = ["step", "duration_s", "data_s", "forward_s", "eval_s", "eval_time_s", "ckpt_total_s", "elapsed_s"]
    assert run_phases({"phases": ["forward", "eval", "data"]}, cols) == ["data", "forward", "eval"]
    assert run_phases({}, cols) == ["data", "forward"]  # an old run: known names only, never a suffix guess
    assert set(KNOWN_PHASES) >= {"data", "forward", "backward", "optimizer", "offload"}


def test_monitor_records_each_phase_it_opens(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor
    from gpudash.store import load_run

    with Monitor(tmp_path / "r", host_hz=0.0, device_hz=0.0, allocator=False, cuda_timing=False,
                 handle_signals=False) as mon:
        for _ in range(3):
            with mon.step():
                with mon.phase("forward"):
                    pass
                with mon.phase("my eval"):
                    pass
                mon.log(eval_time_s=1.0)
    run = load_run(tmp_path / "r")
    try:
        assert run.meta["phases"] == ["forward", "my_eval"]
        assert run_facts(run).phases == ("forward", "my_eval")
    finally:
        run.close()


def test_one_oom_recorded_by_the_observer_and_the_exception_counts_once() -> None:
    ev = [
        {"time": 10.0, "step": 5, "rank": 0, "kind": "oom", "message": "", "data": {"source": "allocator_observer"}},
        {"time": 10.2, "step": 5, "rank": 0, "kind": "oom", "message": "", "data": {"source": "exception"}},
        # a retry of the same step after the batch shrank: a second OOM, its own pair
        {"time": 11.0, "step": 5, "rank": 0, "kind": "oom", "message": "", "data": {"source": "allocator_observer"}},
        {"time": 11.1, "step": 5, "rank": 0, "kind": "oom", "message": "", "data": {"source": "exception"}},
        {"time": 30.0, "step": 9, "rank": 0, "kind": "oom", "message": "", "data": {"source": "exception"}},
        {"time": 30.0, "step": 9, "rank": 1, "kind": "oom", "message": "", "data": {"source": "allocator_observer"}},
    ]
    assert oom_count(_run(events=ev)) == 4
    crashed = _run(meta={"end_reason": "CUDA out of memory. Tried to allocate 2 GiB"}, status="crashed")
    assert oom_count(crashed) == 1


def test_peaks_measured_and_estimator_error() -> None:
    mem = {"step": [0, 1, 2], "rank": [0, 0, 0], "params_bytes": [10, 10, 10], "activations_bytes": [5, None, 7],
           "allocated_peak_bytes": [100.0, 120.0, 110.0], "peak_bytes": [101.0, 125.0, 111.0],
           "predicted_peak_bytes": [50.0, 137.5, 122.1]}  # step 0 (no optimizer state yet) is left out
    f = run_facts(_run(steps={"step": [0, 1, 2], "duration_s": [1.0, 1.0, 1.0], "time": [1.0, 2.0, 3.0]}, memory=mem))
    assert f.peak_bytes == {"params": 10.0, "grads": None, "optimizer": None, "activations": 7.0, "measured": 125.0}
    assert f.estimator_error == pytest.approx(0.1, abs=1e-3)
    del mem["peak_bytes"]
    assert run_facts(_run(memory=mem)).peak_bytes["measured"] == 120.0  # the allocator's per-step peak


def test_to_json_has_no_nan() -> None:
    f = run_facts(_run(steps={"step": [0, 1], "loss": [math.nan, math.inf], "duration_s": [math.nan, math.nan],
                              "time": [1.0, 2.0]}))
    text = json.dumps(f.to_json(), allow_nan=False)
    assert '"nonfinite_steps": [1]' in text and '"step_time_median_s": null' in text


def test_the_cache_rejudges_a_live_run_as_it_grows(tmp_path: Path) -> None:
    """The live light must not freeze: facts of a growing run follow its new steps."""
    from gpudash.monitor import Monitor

    cache = RunCache(live_every_s=0.0)
    with Monitor(tmp_path / "live", host_hz=0.0, device_hz=0.0, allocator=False, cuda_timing=False,
                 handle_signals=False) as mon:
        for _ in range(12):
            with mon.step():
                mon.log(loss=2.0)
        assert mon.flush()
        first = cache.get(tmp_path / "live").facts
        assert first.status == "live" and first.steps == 12
        for _ in range(60):
            with mon.step():
                mon.log(loss=2.0 if mon.step_index != 40 else 9.0)
        assert mon.flush()
        later = cache.get(tmp_path / "live").facts
        assert later.steps == 72 and later.loss_spike_steps == (40,)
        assert later.light("loss spikes").detail == "1 spike(s) in 72 steps"  # type: ignore[union-attr]
    assert cache.get(tmp_path / "live").facts.status == "finished"


def test_dropped_records_are_a_fact(tmp_path: Path) -> None:
    """A full buffer drops the oldest records: the run's step count (last index + 1) then overstates the
    rows, so the facts say how many records were lost, and every surface that renders facts shows it."""
    from helpers.stuck import stuck_writer

    from gpudash.analysis.facts import headline_rows
    from gpudash.monitor import Monitor
    from gpudash.store import load_run

    with Monitor(tmp_path / "r", buffer_records=100, flush_interval=60.0, host_hz=0.0, device_hz=0.0,
                 allocator=False, cuda_timing=False, handle_signals=False) as mon:
        with stuck_writer(mon.recorder):
            for _ in range(300):
                with mon.step():
                    mon.log(loss=1.0)
    dropped = mon.recorder.dropped  # (exact once the writer has read: step rows are let go a block at a time)
    assert dropped >= 200
    run = load_run(tmp_path / "r")
    try:
        f = run_facts(run)
        assert f.dropped_records == dropped and f.steps == 300 and len(run.steps) < 300
        assert f.to_json()["dropped_records"] == dropped
        assert any(label == "not recorded" and f"{dropped:,} record(s) dropped" in text
                   for label, text in headline_rows(f, run.meta))
    finally:
        run.close()
