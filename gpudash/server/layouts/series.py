"""Series: one trace of a live figure, described by plain data so it can be rebuilt or extended.

A figure is a list of :class:`Series` specs. :func:`series_xy` turns a spec and a
table frame into plain lists; the figure builders use it on the whole run and
the live callback on the rows that arrived since the last tick (with the tail
of earlier rows for windowed transforms), so an extend appends exactly what a
rebuild would have drawn.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from gpudash.analysis.memory_parts import allocator_cache, cache_share_pct, frozen_params
from gpudash.analysis.stability import SPIKE_WINDOW, spike_mask
from gpudash.server.layouts.common import hover_template, plot_text
from gpudash.server.layouts.fig import Fig

__all__ = ["FNS", "SMOOTHING", "STYLES", "WINDOW", "Series", "add_series", "ema", "series_xy", "spike_mask"]

#: The smoothing control's choices (0: off).
SMOOTHING = (0.0, 0.6, 0.8, 0.9, 0.95, 0.99)

#: Steps in the rolling window for median / p95 step time; a live extend of spike markers also needs the
#: trailing window of the one spike rule (:func:`gpudash.analysis.stability.spike_mask`).
WINDOW = max(50, SPIKE_WINDOW)


#: What a series draws of its column (:func:`series_xy`); the live state a page sends back is checked against
#: these (:mod:`gpudash.server.layouts.inputs`), so a transform added here is one a live tick accepts.
FNS = ("raw", "cache", "frozen", "rate", "median", "p95", "spike", "frag", "ema", "rate_ema")
STYLES = ("line", "area", "bar", "markers")


@dataclass(frozen=True)
class Series:
    table: str
    col: str
    name: str
    rank: int = 0
    gpu: int | None = None
    x: str = "step"  # "step", "elapsed" (seconds since the run started), "relative" or "wall" (gpudash.server.layouts.xaxis)
    fn: str = "raw"  # one of FNS
    style: str = "line"  # one of STYLES
    yaxis: str = "y"
    color: str | None = None
    stack: str = "mem"
    unit: str = ""  # what the drawn values are in ("MiB", "ms", ...): named on hover
    scale: float = 1.0  # recorded value / scale = drawn value (bytes -> MiB, seconds -> ms)
    smooth: float = 0.0  # ema / rate_ema: the weight of the previous average (TensorBoard's smoothing)
    origin: float = 0.0  # x "relative" / "wall": drawn at (time - origin) ms on a date axis

    @property
    def key(self) -> str:
        """The trace's ``uid``: plotly selects by it (``.cb<uid>``) when a graph goes away, so it is a CSS
        class name (a "|" in it broke leaving the run page by an in-page link)."""
        return "-".join(_css(str(v)) for v in (self.table, self.col, self.rank, self.gpu, self.fn))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Series:
        return cls(**d)

    @property
    def windowed(self) -> bool:
        return self.fn in ("median", "p95", "spike", "ema", "rate_ema")


def _css(text: str) -> str:
    """``text`` with every character a CSS class name cannot hold written as ``_<hex>_``."""
    return re.sub(r"[^0-9A-Za-z]", lambda m: f"_{ord(m.group(0)):x}_" if m.group(0) != "_" else "__", text)


def _num(df: pd.DataFrame, col: str, mask: np.ndarray | None) -> np.ndarray | None:
    if col not in df:
        return None
    a = df[col].to_numpy()
    if a.dtype.kind not in "fiub":
        a = pd.to_numeric(df[col], errors="coerce").to_numpy()
    a = a.astype(float, copy=False)
    return a[mask] if mask is not None else a


def _y(spec: Series, get: Any) -> np.ndarray | None:
    """The y values of ``spec``; ``get(col)`` returns a column as floats (or None)."""
    fn = spec.fn
    if fn in ("cache", "frag"):
        res, alloc = get("reserved_bytes"), get("allocated_bytes")
        if res is None or alloc is None:
            return None
        return allocator_cache(res, alloc) if fn == "cache" else cache_share_pct(res, alloc)
    if fn == "frozen":
        params, trainable = get("params_bytes"), get("trainable_params_bytes")
        return None if params is None or trainable is None else frozen_params(params, trainable)
    y = get(spec.col)
    if y is None:
        return None
    if fn in ("rate", "rate_ema"):
        dur = get("duration_s")
        if dur is None:
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            y = np.where(dur > 0, y / dur, np.nan)
        if fn == "rate":
            return y
    if fn in ("ema", "rate_ema"):
        return ema(y, spec.smooth)
    if fn == "median":
        return pd.Series(y).rolling(WINDOW, min_periods=1).median().to_numpy()
    if fn == "p95":
        return pd.Series(y).rolling(WINDOW, min_periods=1).quantile(0.95).to_numpy()
    if fn == "spike":
        return np.where(spike_mask(y), y, np.nan)
    return y


def ema(y: np.ndarray, smooth: float) -> np.ndarray:
    """Exponential moving average, ``smooth`` the weight of the previous average (0: the values themselves);
    missing values are skipped, not averaged in as zeros."""
    if smooth <= 0:
        return y
    return pd.Series(y).ewm(alpha=1.0 - min(smooth, 0.999), adjust=False, ignore_na=True).mean().to_numpy()


def _round(y: np.ndarray, digits: int = 6) -> np.ndarray:
    """``digits`` significant digits (of the largest value): half the JSON of full doubles, same picture."""
    if not len(y):
        return y
    top = float(np.max(np.abs(y)))
    if top == 0 or not np.isfinite(top):
        return y
    return np.round(y, max(0, digits - 1 - int(np.floor(np.log10(top)))))


def series_xy(spec: Series, df: pd.DataFrame, t0: float = 0.0,
              history: pd.DataFrame | None = None) -> tuple[list[Any], list[Any]]:
    """Plain lists (x, y) of ``spec`` for the rows of ``df``; ``history`` (earlier rows) feeds windows only."""
    if df is None or not len(df):
        return [], []
    mask: np.ndarray | None = None
    if "rank" in df:
        mask = df["rank"].to_numpy() == spec.rank
    if spec.gpu is not None and "gpu" in df:
        g = df["gpu"].to_numpy() == spec.gpu
        mask = g if mask is None else mask & g
    if mask is not None and not mask.any():
        return [], []
    hist = history if history is not None and len(history) and spec.windowed else None
    skip = 0 if hist is None else len(hist)

    def get(col: str) -> np.ndarray | None:
        a = _num(df, col, mask)
        if a is None or hist is None:
            return a
        h = _num(hist, col, None)
        return np.concatenate([h if h is not None else np.full(skip, np.nan), a])

    y = _y(spec, get)
    if y is None:
        return [], []
    if spec.x == "elapsed":
        x = _num(df, "time", mask)
        if x is None:
            return [], []
        x = x - t0
    elif spec.x in ("relative", "wall"):
        x = _num(df, "time", mask)
        if x is None:
            return [], []
        x = (x - spec.origin) * 1000.0  # ms on a date axis
    else:
        x = _num(df, "step", mask)
        if x is None:
            n = len(df) if mask is None else int(mask.sum())
            x = np.arange(n, dtype=float)
    y = y[skip:]
    if spec.scale != 1.0:
        y = y / spec.scale
    ok = np.isfinite(y) & np.isfinite(x)
    xs, ys = x[ok], _round(y[ok])
    if spec.x == "step" and np.all(xs == np.round(xs)):
        return xs.astype(np.int64).tolist(), ys.tolist()
    return xs.tolist(), ys.tolist()


def add_series(fig: Fig, spec: Series, x: list[Any], y: list[Any]) -> None:
    """Append the trace for ``spec`` (``uid`` = its key) to ``fig``; data as plain lists."""
    t: dict[str, Any] = {"x": x, "y": y, "name": plot_text(spec.name), "uid": spec.key, "yaxis": spec.yaxis}
    if spec.unit:
        t["hovertemplate"] = hover_template(spec.unit)
    color = {"color": spec.color} if spec.color else {}
    if spec.style == "bar":
        t.update(type="bar", marker=color)
    elif spec.style == "area":
        t.update(type="scatter", mode="lines", stackgroup=spec.stack, stackgaps="interpolate",
                 line={"width": 0.5, **color})
    elif spec.style == "markers":
        t.update(type="scatter", mode="markers", marker={"size": 9, "symbol": "x", "color": spec.color or "#d62728"})
    else:  # a line of one point is invisible: markers until there are a few
        t.update(type="scatter", mode="lines" if len(x) > 2 else "lines+markers", line={"width": 1.2, **color})
    fig.add_trace(t)
