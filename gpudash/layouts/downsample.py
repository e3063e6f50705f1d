"""Server-side downsampling: no trace sends the browser more than ``MAX_POINTS``.

MinMax-LTTB (the plotly-resampler / tsdownsample recipe, in numpy): keep the
minimum and maximum of many small buckets, then pick one point per final
bucket by largest-triangle-three-buckets. Short peaks (the memory spike
before an OOM) survive; a 1,000,000-point series becomes a few thousand.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_POINTS", "downsample_indices", "minmax_indices", "lttb_indices"]

#: Upper bound on points per trace sent to the browser (about 2x a wide plot's pixels).
MAX_POINTS = 4_000


def minmax_indices(y: np.ndarray, n_buckets: int) -> np.ndarray:
    """Indices of the min and max of ``n_buckets`` equal slices of ``y`` (sorted, unique)."""
    n = len(y)
    if n <= 2 * n_buckets:
        return np.arange(n)
    edges = np.linspace(0, n, n_buckets + 1).astype(np.int64)
    width = int(np.max(np.diff(edges)))
    # pad to a rectangle so argmin/argmax run vectorised over all buckets
    idx = edges[:-1, None] + np.arange(width)[None, :]
    valid = idx < edges[1:, None]
    idx = np.minimum(idx, n - 1)
    vals = np.where(valid, np.nan_to_num(y[idx], nan=np.nanmean(y) if np.isfinite(y).any() else 0.0), np.nan)
    lo = idx[np.arange(len(idx)), np.nanargmin(vals, axis=1)]
    hi = idx[np.arange(len(idx)), np.nanargmax(vals, axis=1)]
    out = np.unique(np.concatenate([[0], lo, hi, [n - 1]]))
    return out


def lttb_indices(x: np.ndarray, y: np.ndarray, n_out: int) -> np.ndarray:
    """Largest-triangle-three-buckets: ``n_out`` indices that keep the shape of (x, y)."""
    n = len(y)
    if n <= n_out or n_out < 3:
        return np.arange(n)
    x = x.astype(float)
    y = np.nan_to_num(y.astype(float))
    edges = np.linspace(1, n - 1, n_out - 1).astype(np.int64)
    out = np.empty(n_out, dtype=np.int64)
    out[0], out[-1] = 0, n - 1
    prev = 0
    for i in range(n_out - 2):
        lo, hi = edges[i], max(edges[i + 1], edges[i] + 1)
        nlo, nhi = edges[i + 1], edges[i + 2] if i + 2 < len(edges) else n
        nhi = max(nhi, nlo + 1)
        ax, ay = x[nlo:nhi].mean(), y[nlo:nhi].mean()
        px, py = x[prev], y[prev]
        area = np.abs((px - ax) * (y[lo:hi] - py) - (px - x[lo:hi]) * (ay - py))
        prev = lo + int(np.argmax(area))
        out[i + 1] = prev
    return out


def downsample_indices(x: np.ndarray, y: np.ndarray, n_out: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most ``n_out`` points of (x, y): MinMax preselection, then LTTB."""
    x = np.asarray(x)
    y = np.asarray(y, dtype=float)
    n = len(y)
    if n <= n_out:
        return np.arange(n)
    pre = minmax_indices(y, n_out * 2)
    if len(pre) <= n_out:
        return pre
    sel = lttb_indices(x[pre], y[pre], n_out)
    return pre[sel]
