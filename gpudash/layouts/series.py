"""Series: one trace of a live figure, described by plain data so it can be rebuilt or extended.

A figure is a list of :class:`Series` specs. :func:`series_xy` turns a spec and a
table frame into plain lists; the figure builders use it on the whole run and
the live callback on the rows that arrived since the last tick (with the tail
of earlier rows for windowed transforms), so an extend appends exactly what a
rebuild would have drawn.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

__all__ = ["WINDOW", "Series", "add_series", "series_xy", "spike_mask"]

#: Steps in the rolling window for median / p95 step time and spike detection.
WINDOW = 50


@dataclass(frozen=True)
class Series:
    table: str
    col: str
    name: str
    rank: int = 0
    gpu: int | None = None
    x: str = "step"  # "step" or "elapsed" (seconds since the run started)
    fn: str = "raw"  # raw | cache | rate | median | p95 | spike | frag
    style: str = "line"  # line | area | bar | markers
    yaxis: str = "y"
    color: str | None = None

    @property
    def key(self) -> str:
        return f"{self.table}|{self.col}|{self.rank}|{self.gpu}|{self.fn}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Series:
        return cls(**d)

    @property
    def windowed(self) -> bool:
        return self.fn in ("median", "p95", "spike")


def spike_mask(values: np.ndarray, window: int = WINDOW, z: float = 6.0) -> np.ndarray:
    """True where a value jumps far above the median of the ``window`` values before it.

    Robust z-score against the trailing median absolute deviation, and at least
    20 % above that median, so noise on a flat loss is not called a spike.
    """
    s = pd.Series(values, dtype=float)
    prev = s.shift(1)
    med = prev.rolling(window, min_periods=min(10, window)).median()
    mad = (prev - med).abs().rolling(window, min_periods=min(10, window)).median()
    scale = 1.4826 * mad.clip(lower=1e-12)
    mask = ((s - med) / scale > z) & (s > med * 1.2) | ~np.isfinite(s) & s.notna()
    out: np.ndarray = mask.fillna(False).to_numpy(dtype=bool)
    return out


def _y(spec: Series, df: pd.DataFrame) -> pd.Series | None:
    fn, col = spec.fn, spec.col
    if fn == "cache":
        if "reserved_bytes" not in df or "allocated_bytes" not in df:
            return None
        return (df["reserved_bytes"] - df["allocated_bytes"]).clip(lower=0)
    if fn == "frag":
        if "reserved_bytes" not in df or "allocated_bytes" not in df:
            return None
        res = df["reserved_bytes"].where(df["reserved_bytes"] > 0)
        return 100.0 * (res - df["allocated_bytes"]).clip(lower=0) / res
    if col not in df:
        return None
    y = pd.to_numeric(df[col], errors="coerce")
    if fn == "rate":
        dur = df["duration_s"] if "duration_s" in df else None
        return None if dur is None else y / dur.where(dur > 0)
    if fn == "median":
        return y.rolling(WINDOW, min_periods=1).median()
    if fn == "p95":
        return y.rolling(WINDOW, min_periods=1).quantile(0.95)
    if fn == "spike":
        return y.where(spike_mask(y.to_numpy()))
    return y


def series_xy(spec: Series, df: pd.DataFrame, t0: float = 0.0,
              history: pd.DataFrame | None = None) -> tuple[list[Any], list[Any]]:
    """Plain lists (x, y) of ``spec`` for the rows of ``df``; ``history`` (earlier rows) feeds windows only."""
    if df is None or not len(df):
        return [], []
    part = df
    if "rank" in part:
        part = part[part["rank"] == spec.rank]
    if spec.gpu is not None and "gpu" in part:
        part = part[part["gpu"] == spec.gpu]
    if not len(part):
        return [], []
    skip = 0
    if history is not None and len(history) and spec.windowed:
        skip = len(history)
        part = pd.concat([history, part], ignore_index=True)
    y = _y(spec, part)
    if y is None:
        return [], []
    if spec.x == "elapsed":
        x = part["time"].astype(float) - t0
    else:
        x = part["step"] if "step" in part else pd.Series(np.arange(len(part)))
    x, y = x.iloc[skip:], y.iloc[skip:]
    ok = y.notna() & np.isfinite(y.astype(float)) & x.notna()
    xs = x[ok].to_numpy()
    if spec.x == "step" and xs.dtype.kind == "f" and np.all(xs == np.round(xs)):
        xs = xs.astype(np.int64)
    return xs.tolist(), y[ok].astype(float).tolist()


def add_series(fig: go.Figure, spec: Series, x: list[Any], y: list[Any]) -> None:
    """Append the trace for ``spec`` (``uid`` = its key) to ``fig``; data as plain lists."""
    common: dict[str, Any] = {"x": x, "y": y, "name": spec.name, "uid": spec.key, "yaxis": spec.yaxis}
    if spec.color:
        common["marker"] = {"color": spec.color}
    if spec.style == "bar":
        fig.add_trace(go.Bar(**common))
    elif spec.style == "area":
        fig.add_trace(go.Scatter(mode="lines", stackgroup="mem", stackgaps="interpolate",
                                 line={"width": 0.5, **({"color": spec.color} if spec.color else {})},
                                 **{k: v for k, v in common.items() if k != "marker"}))
    elif spec.style == "markers":
        fig.add_trace(go.Scatter(mode="markers", **{**common, "marker": {"size": 9, "symbol": "x",
                                                                         "color": spec.color or "#d62728"}}))
    else:
        fig.add_trace(go.Scatter(mode="lines", line={"width": 1.2, **({"color": spec.color} if spec.color else {})},
                                 **{k: v for k, v in common.items() if k != "marker"}))
