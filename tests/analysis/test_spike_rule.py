"""The vectorised spike rule gives the rule's own numbers, value by value, and the run's loss in step order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudash.analysis.stability import (
    SPIKE_MIN_HISTORY,
    SPIKE_RATIO,
    SPIKE_WINDOW,
    SPIKE_Z,
    loss_series,
    loss_spikes,
    spike_mask,
    spike_scores,
)
from gpudash.store.run import Run


def rule(values: np.ndarray, window: int = SPIKE_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """The rule as its docstring states it, one value at a time."""
    x = np.asarray(values, dtype=float)
    mask, z = np.zeros(len(x), dtype=bool), np.full(len(x), np.nan)
    for i in range(len(x)):
        prev = x[max(0, i - window):i]
        prev = prev[np.isfinite(prev)]
        if len(prev) < SPIKE_MIN_HISTORY or not np.isfinite(x[i]):
            continue
        med = np.median(prev)
        scale = max(1.4826 * np.median(np.abs(prev - med)), 1e-3 * abs(med), 1e-12)
        z[i] = (x[i] - med) / scale
        mask[i] = z[i] > SPIKE_Z and x[i] - med > (SPIKE_RATIO - 1.0) * abs(med)
    return mask, z


def _series() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    n = 2500
    s = np.arange(n)
    loss = 3.0 * np.exp(-s / 800) + 0.05 * rng.random(n)
    loss[[300, 301, 1700]] *= 8
    holes = loss.copy()
    holes[rng.integers(0, n, 120)] = np.nan
    holes[rng.integers(0, n, 20)] = np.inf
    holes[900:960] = np.nan  # a gap longer than the window
    flat = np.full(n, 1.5)
    flat[[40, 41, 2000]] = 9.0
    ties = rng.integers(0, 3, n).astype(float)
    negative = -np.abs(rng.standard_normal(n))
    negative[[100, 1500]] = 4.0
    return {"loss": loss, "holes": holes, "flat": flat, "ties": ties, "negative": negative,
            "rising": (s / 10.0) ** 2,  # every value above 1.2x its median: all scored
            "noise": rng.random(n), "short": loss[:11]}


@pytest.mark.parametrize("name", list(_series()))
def test_vectorised_rule_matches_the_rule_value_by_value(name: str) -> None:
    x = _series()[name]
    want_mask, want_z = rule(x)
    mask, z = spike_scores(x)
    np.testing.assert_array_equal(mask, want_mask)
    np.testing.assert_array_equal(z, want_z)
    np.testing.assert_array_equal(spike_mask(x), want_mask)


def test_a_window_too_short_for_the_history_calls_nothing() -> None:
    x = _series()["flat"]
    assert not spike_scores(x, window=SPIKE_MIN_HISTORY - 1)[0].any()
    np.testing.assert_array_equal(spike_mask(x, window=12), rule(x, window=12)[0])


def _run(steps: pd.DataFrame) -> Run:
    return Run(path=Path("mem"), meta={}, status="finished", steps=steps, memory=pd.DataFrame(),
               events=pd.DataFrame())


def test_loss_is_read_in_step_order_for_the_lowest_rank() -> None:
    loss = np.full(60, 2.0) + 0.001 * np.arange(60)
    loss[45] = 20.0
    rows = pd.DataFrame({"step": np.arange(60), "loss": loss, "rank": 0})
    other = rows.assign(rank=1, loss=5.0)
    shuffled = pd.concat([other, rows]).sample(frac=1.0, random_state=3)
    for frame in (rows, shuffled, shuffled.assign(rank=np.nan)):
        steps, values = loss_series(_run(frame))
        if frame["rank"].notna().any():
            np.testing.assert_array_equal(steps, np.arange(60))
            np.testing.assert_array_equal(values, loss)
        else:  # no rank recorded: every row is the one rank's, in step order
            assert list(steps) == sorted(steps)
    assert loss_spikes(_run(shuffled)) == [45]
