from __future__ import annotations

import numpy as np

from gpudash.layouts.downsample import MAX_POINTS, downsample_indices, lttb_indices, minmax_indices


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


def test_minmax_and_lttb_shapes() -> None:
    y = np.concatenate([np.zeros(5000), np.ones(5000)])
    mm = minmax_indices(y, 100)
    assert len(mm) <= 202
    lt = lttb_indices(np.arange(len(y)), y, 50)
    assert len(lt) == 50 and lt[0] == 0 and lt[-1] == len(y) - 1


def test_nan_values_do_not_break() -> None:
    y = np.full(20_000, np.nan)
    y[::3] = 1.0
    idx = downsample_indices(np.arange(len(y)), y, 1000)
    assert len(idx) <= 1000
