"""Stability verdicts on runs that really misbehaved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudash.analysis.stability import (
    loss_spikes,
    nonfinite_steps,
    ranges,
    spike_mask,
    stability_verdicts,
    trailing_spike,
)


def _by_kind(run: Any) -> dict[str, Any]:
    return {v.kind: v for v in stability_verdicts(run)}


def test_corrupted_batch_is_a_loss_spike(recorded: Any) -> None:
    run = recorded("loop-spike", loop={"steps": 60, "bad_batch_at": (40,)})
    assert loss_spikes(run) == [40]
    v = _by_kind(run)["loss-spike"]
    assert v.steps == (40, 40) and any("step 40" in e for e in v.evidence)


def test_clean_run_has_no_stability_verdicts(recorded: Any) -> None:
    assert _by_kind(recorded("healthy")) == {}


def test_fp16_overflow_collapses_the_loss_scale_and_falls_back(recorded: Any) -> None:
    run = recorded("loop-fp16", loop={"steps": 40, "fp16_overflow_at": tuple(range(20, 26)), "fallback_after": 5})
    kinds = _by_kind(run)
    assert kinds["loss-scale-collapse"].steps is not None and kinds["loss-scale-collapse"].steps[0] >= 20
    assert kinds["precision-fallback"].steps == (24, 24)
    assert set(nonfinite_steps(run)) == set(range(20, 25))


def test_trainer_nan_injection_and_fallback(recorded: Any) -> None:
    run = recorded("precision-fallback")  # fp16, --inject-nan-at-step 20..23, fallback after 3
    kinds = _by_kind(run)
    assert kinds["non-finite"].steps == (20, 23)
    assert kinds["precision-fallback"].severity == "warn" and "fp32" in kinds["precision-fallback"].evidence[0]


def test_adaptive_batch_that_keeps_hitting_the_budget_oscillates(recorded: Any) -> None:
    v = _by_kind(recorded("oom-recovered"))["batch-oscillation"]
    assert v.numbers["max_batch"] > v.numbers["settled_batch"] >= v.numbers["min_batch"]


def test_ranges() -> None:
    assert ranges([5, 1, 2, 3, 9]) == [(1, 3), (5, 5), (9, 9)]


def test_one_spike_rule_for_markers_summary_and_the_live_trainer() -> None:
    """Issue 11: on a flat loss with +30 % at step 150 and x2 at step 220 the chart markers, the analysis
    and the trainer's live detector flagged {150, 220}, {220} and {150, 220}. Now one rule: {150, 220}."""
    import math

    import numpy as np
    import pandas as pd

    from gpudash.server.layouts.series import Series, series_xy
    from gpudash.store.run import Run
    from gpudash.trainer.loop import _SpikeDetector

    loss = [2.0 + 0.004 * math.sin(1.3 * s) for s in range(300)]
    loss[150] *= 1.3
    loss[220] *= 2.0
    steps = pd.DataFrame({"step": range(300), "loss": loss, "rank": 0})
    run = Run(path=Path("."), meta={}, status="finished", steps=steps, memory=pd.DataFrame(), events=pd.DataFrame())
    assert loss_spikes(run) == [150, 220]
    x, _ = series_xy(Series("steps", "loss", "spike", fn="spike", style="markers"), steps)
    assert x == [150, 220]
    live = _SpikeDetector()
    assert [s for s, v in enumerate(loss) if live.check(v) is not None] == [150, 220]
    v = _by_kind(run)["loss-spike"]
    assert v.numbers["count"] == 2 and v.title.startswith("2 loss spike")
    # the live answer on a trailing window equals the whole-run answer at every step, NaNs included
    rng = np.random.default_rng(3)
    noisy = list(2.0 + 0.05 * rng.standard_normal(400))
    for s in (50, 51, 200, 333):
        noisy[s] *= 1.6
    noisy[120] = float("nan")
    live = _SpikeDetector()
    assert [s for s, v in enumerate(noisy) if live.check(v) is not None] == list(np.flatnonzero(spike_mask(noisy)))


def test_no_spike_before_the_window_has_history_or_on_a_falling_loss() -> None:
    import numpy as np

    assert not spike_mask([5.0, 50.0, 5.0]).any()
    falling = np.linspace(6.0, 3.0, 200) + 0.01 * np.sin(np.arange(200))
    assert not spike_mask(falling).any()
    assert trailing_spike([2.0] * 5 + [9.0]) is None  # fewer than SPIKE_MIN_HISTORY losses before it
    z = trailing_spike([2.0] * 20 + [9.0])
    assert z is not None and z > 6
