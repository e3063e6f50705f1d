"""tokens/s, samples/s and MFU: one definition (gpudash/analysis/rates.py), the cases where the old ones disagreed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudash.analysis.rates import (
    RECENT_STEPS,
    device_peak_flops,
    fmt_mfu,
    fmt_rate,
    mfu,
    mfu_inputs,
    per_second,
    recent_steps,
    throughput,
)
from gpudash.store.run import run_start


def _steps(n: int, step_s: float = 0.1, gap_s: float = 0.0, tokens: float = 100.0, rank: int = 0,
           t0: float = 1000.0) -> pd.DataFrame:
    ends = t0 + np.arange(1, n + 1) * (step_s + gap_s) - gap_s
    return pd.DataFrame({"step": np.arange(n), "rank": rank, "time": ends, "duration_s": step_s,
                         "tokens": tokens, "samples": 4.0})


def test_the_rate_is_over_wall_time_gaps_between_steps_included() -> None:
    """The run page's header once divided by the sum of step durations: an evaluation or a checkpoint between
    steps vanished from the rate, which said 1,000 tokens/s of a run whose clock saw 500. Kept: wall time
    (what ``gpudash info`` and the report said), the time the run spent."""
    s = _steps(50, step_s=0.1, gap_s=0.1)
    tp = throughput(s)
    assert tp.tokens_per_s == pytest.approx(50 * 100 / (50 * 0.2 - 0.1))
    assert tp.tokens_per_s == pytest.approx(100 / 0.2, rel=0.02)  # not 100 / 0.1
    assert tp.samples_per_s == pytest.approx(tp.tokens_per_s * 4 / 100)
    assert tp.step_time_median_s == pytest.approx(0.1)


def test_without_durations_the_first_step_is_left_out() -> None:
    """/metrics once counted the window's steps from its second (no start time for the first): the same
    rate when durations are known, and what per_second does without them."""
    s = _steps(20)
    with_d = per_second(s["tokens"], s["time"], s["duration_s"])
    without = per_second(s["tokens"], s["time"])
    assert with_d == pytest.approx(1000.0) and without == pytest.approx(1000.0)
    assert per_second([5.0], [10.0]) is None  # one end time: no span
    assert per_second([], []) is None
    assert per_second([np.nan, np.nan], [1.0, 2.0]) is None


def test_ranks_together_and_the_recent_window_by_step_number() -> None:
    a, b = _steps(300, rank=0), _steps(300, rank=1)
    both = pd.concat([a, b], ignore_index=True)
    assert throughput(both).tokens_per_s == pytest.approx(2 * throughput(a).tokens_per_s)  # the job's rate
    recent = recent_steps(both)
    assert len(recent) == 2 * RECENT_STEPS and set(recent["step"]) == set(range(300 - RECENT_STEPS, 300))
    tp = throughput(both, last=RECENT_STEPS)
    assert (tp.steps, tp.ranks) == (RECENT_STEPS, 2)
    # a slower second half: the recent rate sees it, the whole run's is between
    slow = _steps(300)
    slow.loc[150:, "time"] = slow["time"].iloc[149] + np.arange(1, 151) * 0.2
    slow.loc[150:, "duration_s"] = 0.2
    assert throughput(slow, last=RECENT_STEPS).tokens_per_s == pytest.approx(500.0)
    assert 500.0 < throughput(slow).tokens_per_s < 1000.0  # type: ignore[operator]


def test_mfu_against_the_device_peak() -> None:
    meta = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "estimate": {"flops_per_token": 6e6}}
    assert device_peak_flops(meta) == 989e12
    assert device_peak_flops({"device": "cuda:0", "device_name": "NVIDIA H100 PCIe"}) == 756e12
    assert device_peak_flops({"device": "cpu", "device_name": "H100"}) is None  # a CPU run: no tensor cores
    assert device_peak_flops({"config": {"peak_flops": 1e12}}) == 1e12  # the user's own number wins
    assert mfu_inputs(meta) == {"peak_flops": 989e12, "flops_per_token": 6e6}
    assert mfu(1e6, meta) == pytest.approx(1e6 * 6e6 / 989e12)
    assert mfu(2e6, meta, devices=2) == pytest.approx(mfu(1e6, meta))  # per device, ranks together
    assert mfu(1e6, {"device": "cpu"}) is None
    assert mfu(None, meta) is None
    assert mfu(1e6, meta, logged=pd.Series([0.3, 0.4, np.nan, 0.5])) == pytest.approx(0.4)  # the user's mfu
    s = _steps(50)
    assert throughput(s, meta).mfu == pytest.approx(1000.0 * 6e6 / 989e12)


def test_formats() -> None:
    assert fmt_rate(38612.4) == "38,612" and fmt_rate(29.63) == "29.6" and fmt_rate(None) == "-"
    assert fmt_rate(float("nan")) == "-"
    assert fmt_mfu(0.4134) == "41.3 %" and fmt_mfu(None) == "-"


def test_run_start_is_the_earliest_record() -> None:
    """Run start was ``created_at or started_at`` in three places and the earliest rank's ``started_at`` in the
    cost: a torchrun job's ranks each write run.json, so created_at is the last rank's. Kept: the earliest."""
    assert run_start({"created_at": 100.0, "started_at": 101.0}) == 100.0
    assert run_start({"created_at": 105.0}, {0: {"started_at": 103.0}, 1: {"started_at": 101.0}}) == 101.0
    assert run_start({"created_at": "bad", "started_at": None}) is None
    assert run_start({}, {0: {"started_at": float("nan")}}) is None


def test_a_crashed_run_says_why_in_one_place(tmp_path: Path) -> None:
    """``gpudash.load_run`` and the run page's view once each decided a dead writer's end reason."""
    import subprocess
    import sys

    from gpudash.server.layouts.data import load_view
    from gpudash.store import RunReader, load_run
    from gpudash.store.run import DIED

    code = ("import os, sys; from gpudash.store.writer import Recorder\n"
            "r = Recorder(sys.argv[1], rank=0, flush_interval=0.1)\n"
            "r.put('steps', {'step': 0, 'time': 1000.0, 'duration_s': 0.1})\n"
            "r.flush(); os._exit(1)\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "dead")], check=False, timeout=120)
    run = load_run(tmp_path / "dead")
    reader = RunReader(tmp_path / "dead")
    try:
        view = load_view(reader)
    finally:
        reader.close()
        run.close()
    assert run.status == view.status == "crashed"
    assert run.meta["end_reason"] == view.meta["end_reason"] == DIED
    assert view.meta["status"] == run.meta["status"] == "crashed"


def test_the_trainers_progress_line_says_the_same_rate() -> None:
    """The progress line once said tokens seen / time since the loop began (the first step's compilation in it
    for the whole run); it is :func:`per_second` of its last steps, as /metrics and the run page say."""
    pytest.importorskip("torch")
    from gpudash.trainer.progressline import ProgressLine

    p = ProgressLine(300)
    ends = 1000.0 + np.concatenate([[10.0], 10.0 + np.arange(1, 300) * 0.5])  # a 10 s first step, then 0.5 s
    for done, end in enumerate(ends, start=1):
        p.update(done, 2.0, 4, 256.0, end=float(end))
    window = list(p.tokens)
    assert len(window) == RECENT_STEPS + 1
    rate = per_second([n for _, n in window], [t for t, _ in window])
    assert rate == pytest.approx(256.0 / 0.5)
    assert f"{fmt_rate(rate)} tok/s" in p.line(300, 2.0, 4, rate, now=p.start + 160.0)
