"""Device and host views: SM activity, PCIe, DRAM, power, temperature, clocks (NVML) and the
host's CPU and memory (psutil), one panel per unit, a line per rank and GPU."""

from __future__ import annotations

import pandas as pd
from gpudash.layouts.common import base_figure, waiting_figure
from gpudash.layouts.fig import Fig
from gpudash.layouts.series import Series, add_series, series_xy

__all__ = ["UNITS", "device_series", "host_series", "panels_figure", "unit_of"]

#: column suffix -> panel title, in display order.
UNITS: tuple[tuple[str, str], ...] = (
    ("_pct", "%"),
    ("_mib_s", "MiB/s"),
    ("_bytes", "bytes"),
    ("_w", "W"),
    ("_c", "°C"),
    ("_mhz", "MHz"),
)
_SKIP = {"time", "rank", "gpu", "step", "total_bytes", "threads"}


def unit_of(col: str) -> str:
    for suffix, unit in UNITS:
        if col.endswith(suffix):
            return unit
    return "other"


def _numeric_cols(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c not in _SKIP and "__" not in c
            and pd.api.types.is_numeric_dtype(df[c]) and df[c].notna().any()]


def _panel_axes(cols: list[str]) -> dict[str, str]:
    order = [u for _, u in UNITS] + ["other"]
    units = sorted({unit_of(c) for c in cols}, key=order.index)
    return {u: ("y" if i == 0 else f"y{i + 1}") for i, u in enumerate(units)}


def device_series(device: pd.DataFrame) -> list[Series]:
    cols = _numeric_cols(device)
    axes = _panel_axes(cols)
    keys = device[["rank", "gpu"]].drop_duplicates().sort_values(["rank", "gpu"]).itertuples(index=False) \
        if len(device) and "gpu" in device else []
    keys = list(keys)
    out = []
    for col in cols:
        for rank, gpu in keys:
            label = col if len(keys) == 1 else f"{col} r{rank} gpu{gpu}"
            out.append(Series("device", col, label, rank=int(rank), gpu=int(gpu), x="elapsed", yaxis=axes[unit_of(col)]))
    return out


def host_series(host: pd.DataFrame) -> list[Series]:
    cols = [c for c in ("cpu_pct", "system_cpu_pct", "rss_bytes", "available_bytes") if c in host] or _numeric_cols(host)
    cols = [c for c in cols if host[c].notna().any()]
    axes = _panel_axes(cols)
    ranks = sorted(int(r) for r in host["rank"].unique()) if len(host) else []
    return [Series("host", c, c if len(ranks) == 1 else f"{c} r{r}", rank=r, x="elapsed", yaxis=axes[unit_of(c)])
            for c in cols for r in ranks]


def panels_figure(title: str, frames: dict[str, pd.DataFrame], specs: list[Series], t0: float, live: bool = False,
                  axis_titles: dict[str, str] | None = None, xaxis_title: str = "seconds since start") -> Fig:
    """One panel per y axis (per unit), stacked, sharing the x axis."""
    axes = sorted({s.yaxis for s in specs}, key=lambda a: int(a[1:] or 1))
    n = max(len(axes), 1)
    fig = base_figure(title, height=170 + 130 * n, xaxis_title=xaxis_title)
    gap = 0.06
    h = (1 - gap * (n - 1)) / n
    unit_by_axis = {s.yaxis: unit_of(s.col) for s in specs}
    unit_by_axis.update(axis_titles or {})
    for i, ax in enumerate(axes):
        top = 1 - i * (h + gap)
        name = "yaxis" if ax == "y" else f"yaxis{ax[1:]}"
        unit = unit_by_axis[ax]
        spec: dict[str, object] = {"domain": [max(top - h, 0), top], "anchor": "x", "title": {"text": unit}}
        if unit.startswith("log"):
            spec.update(type="log", title={"text": unit.removeprefix("log ")})
        if unit == "bytes":
            spec.update(tickformat=".3s", ticksuffix="B")
        fig.update_layout({name: spec})
    for s in specs:
        add_series(fig, s, *series_xy(s, frames.get(s.table, pd.DataFrame()), t0))
    if not specs and live:
        waiting_figure(fig)
    return fig
