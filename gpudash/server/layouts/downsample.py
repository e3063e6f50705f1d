"""Server-side downsampling: no trace sends the browser more than ``MAX_POINTS``.

MinMax-LTTB from ``tsdownsample`` (a maintained Rust library, the plotly-resampler recipe): the minimum
and maximum of many small buckets are kept, then one point per final bucket is picked by
largest-triangle-three-buckets. Short peaks (the memory spike before an OOM, a one-step loss spike)
survive; the series' own minimum and maximum are always kept; a 1,000,000-point series becomes a few
thousand in milliseconds.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

__all__ = ["MAX_POINTS", "downsample_indices"]

#: Upper bound on points per trace sent to the browser: about 1.5 per pixel of a 1,300-px-wide chart (min and max
#: of each bucket kept, so no peak is lost); a zoom re-queries the range at this resolution.
MAX_POINTS = 2_000


@cache
def _minmax_lttb() -> Any:  # imported when first used: a starting server does not load numpy for it
    from tsdownsample import MinMaxLTTBDownsampler

    return MinMaxLTTBDownsampler()


def downsample_indices(x: np.ndarray, y: np.ndarray, n_out: int = MAX_POINTS) -> np.ndarray:
    """Sorted indices of at most ``n_out`` points of (x, y) that keep its shape and extremes.

    NaN values are never picked (they draw nothing); ``x`` that is not sorted (a restarted step
    counter) is downsampled by position."""
    y = np.asarray(y, dtype=np.float64)
    n = len(y)
    if n <= n_out:
        return np.arange(n)
    finite = np.isfinite(y)
    pos = np.flatnonzero(finite) if not finite.all() else None
    yy = y if pos is None else y[pos]
    if len(yy) <= n_out:
        return pos if pos is not None else np.arange(n)
    xx = np.asarray(x)
    xx = (xx if pos is None else xx[pos])
    if xx.dtype.kind not in "iuf" or not np.all(np.diff(xx) >= 0):
        xx = np.arange(len(yy), dtype=np.int64)
    elif xx.dtype.kind == "f" and not np.isfinite(xx).all():
        xx = np.arange(len(yy), dtype=np.int64)
    idx = _minmax_lttb().downsample(np.ascontiguousarray(xx), np.ascontiguousarray(yy), n_out=max(n_out - 2, 4))
    idx = np.unique(np.concatenate([np.asarray(idx, dtype=np.int64), [int(np.argmin(yy)), int(np.argmax(yy))]]))
    return idx if pos is None else pos[idx]
