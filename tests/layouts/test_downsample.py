from __future__ import annotations

import numpy as np

from gpudash.server.layouts.downsample import MAX_POINTS, downsample_indices


def test_small_series_untouched() -> None:
    x = np.arange(100)
    assert list(downsample_indices(x, np.sin(x))) == list(range(100))


def test_million_points_bounded_and_peak_kept() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(1_000_000)
    y[123_456] = 100.0  # a one-step memory spike before an OOM must survive
    y[654_321] = -100.0
    idx = downsample_indices(np.arange(len(y)), y)
    assert len(idx) <= MAX_POINTS
    assert 123_456 in idx and 654_321 in idx
    assert idx[0] == 0 and idx[-1] == len(y) - 1
    assert np.all(np.diff(idx) > 0)


def test_local_spikes_in_noise_survive() -> None:
    """Every isolated spike (not only the global maximum) of a noisy 200 k series is drawn."""
    rng = np.random.default_rng(1)
    y = 1.0 + 0.01 * rng.standard_normal(200_000)
    spikes = [10_000, 77_777, 150_000, 199_990]
    for k, s in enumerate(spikes):
        y[s] = 2.0 + k * 0.1
    idx = downsample_indices(np.arange(len(y)), y, 2_000)
    assert len(idx) <= 2_000 and set(spikes) <= set(idx.tolist())


def test_step_x_and_unsorted_x() -> None:
    x = np.arange(50_000, dtype=np.int64) * 3
    y = np.cos(x / 1000.0)
    idx = downsample_indices(x, y, 500)
    assert 0 < len(idx) <= 500 and np.all(np.diff(idx) > 0)
    shuffled = np.random.default_rng(2).permutation(x)  # a restarted counter: by position, no error
    assert len(downsample_indices(shuffled, y, 500)) <= 500


def test_nan_values_do_not_break() -> None:
    y = np.full(20_000, np.nan)
    y[::3] = 1.0
    y[3 * 1234] = 9.0
    idx = downsample_indices(np.arange(len(y)), y, 1000)
    assert len(idx) <= 1000 and 3 * 1234 in idx and np.isfinite(y[idx]).all()
