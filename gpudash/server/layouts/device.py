"""Device and host views: SM activity, PCIe, DRAM, power, temperature, clocks (NVML) and the
host's CPU and memory (psutil), one panel per unit, a line per rank and GPU."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from gpudash.server.layouts.common import AXIS, base_figure, byte_unit, unit_axis, waiting_figure
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.series import Series, add_series, series_xy

__all__ = ["LABELS", "UNITS", "device_series", "host_series", "label_of", "panels_figure", "unit_of"]

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
#: Legend names of the recorded columns (anything else: the column name without its unit suffix, in words).
LABELS: dict[str, str] = {
    "cpu_pct": "process CPU", "system_cpu_pct": "all CPUs", "rss_bytes": "process RSS",
    "malloc_used_bytes": "malloc in use",
    "available_bytes": "RAM available", "pinned_bytes": "pinned host memory", "util_pct": "GPU utilization",
    "mem_util_pct": "memory controller busy", "sm_active_pct": "SM active", "sm_occupancy_pct": "SM occupancy",
    "tensor_active_pct": "tensor cores active", "dram_active_pct": "DRAM active", "pcie_tx_mib_s": "PCIe TX",
    "pcie_rx_mib_s": "PCIe RX", "nvlink_tx_mib_s": "NVLink TX", "nvlink_rx_mib_s": "NVLink RX",
    "power_w": "power", "temp_c": "temperature", "sm_clock_mhz": "SM clock", "mem_clock_mhz": "memory clock",
    "used_bytes": "device memory used", "process_bytes": "this process on the device",
}
#: Byte columns that get a panel of their own (a 500 MiB RSS is a flat line on a 64 GiB "RAM available" axis).
OWN_PANEL = {"rss_bytes": "process RSS", "malloc_used_bytes": "process RSS", "available_bytes": "RAM available"}
_BY_PROCESS = {"main_pss_bytes": "main PSS", "children_pss_bytes": "all workers PSS", "shm_used_bytes": "/dev/shm",
               "pinned_bytes": "pinned host memory"}
_WORKER_PSS = re.compile(r"^child(\d+)_pss_bytes$")


def label_of(col: str) -> str:
    """``cpu_pct`` -> ``process CPU``; unknown columns lose their unit suffix and underscores."""
    if col in LABELS:
        return LABELS[col]
    if (by := _by_process(col)) is not None:
        return by
    for suffix, _ in UNITS:
        if col.endswith(suffix):
            col = col[: -len(suffix)]
            break
    return col.replace("_", " ")


def unit_of(col: str) -> str:
    for suffix, unit in UNITS:
        if col.endswith(suffix):
            return unit
    return "other"


def _numeric_cols(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c not in _SKIP and "__" not in c
            and pd.api.types.is_numeric_dtype(df[c]) and df[c].notna().any()]


def _panel(col: str) -> str:
    return "host memory by process" if _by_process(col) else OWN_PANEL.get(col, unit_of(col))


def _panel_axes(cols: list[str]) -> dict[str, str]:
    order = [u for _, u in UNITS] + ["other"]
    panels = sorted({_panel(c) for c in cols}, key=lambda p: (order.index(unit_of(next(
        c for c in cols if _panel(c) == p))), p))
    return {p: ("y" if i == 0 else f"y{i + 1}") for i, p in enumerate(panels)}


def _unit_kw(df: pd.DataFrame, cols: list[str], col: str) -> dict[str, object]:
    """Bytes drawn in the binary unit of their panel's largest value; other units named on hover."""
    unit = unit_of(col)
    if unit == "bytes":
        same = [c for c in cols if _panel(c) == _panel(col)]
        top = float(np.nanmax(df[same].to_numpy(dtype=float))) if len(df) else None
        name, scale = byte_unit(top)
        return {"unit": name, "scale": scale}
    return {"unit": unit} if unit != "other" else {}


def device_series(device: pd.DataFrame) -> list[Series]:
    cols = _numeric_cols(device)
    axes = _panel_axes(cols)
    keys = device[["rank", "gpu"]].drop_duplicates().sort_values(["rank", "gpu"]).itertuples(index=False) \
        if len(device) and "gpu" in device else []
    keys = list(keys)
    out = []
    for col in cols:
        for rank, gpu in keys:
            label = label_of(col) if len(keys) == 1 else f"{label_of(col)} r{rank} gpu{gpu}"
            out.append(Series("device", col, label, rank=int(rank), gpu=int(gpu), x="elapsed", yaxis=axes[_panel(col)],
                              **_unit_kw(device, cols, col)))  # type: ignore[arg-type]
    return out


def _by_process(col: str) -> str | None:
    """The label of a host-memory-by-process column (``main_pss_bytes`` -> ``main PSS``), else None."""
    m = _WORKER_PSS.match(col)
    if m:
        return f"worker {m.group(1)} PSS"
    return _BY_PROCESS.get(col)


def host_series(host: pd.DataFrame) -> list[Series]:
    cols = [c for c in ("cpu_pct", "system_cpu_pct", "rss_bytes", "available_bytes") if c in host] or _numeric_cols(host)
    # host memory by process (gpudash.collectors.procmem): the training process and each worker, in a panel
    cols += sorted((c for c in host.columns if _by_process(c) and c not in cols),
                   key=lambda c: (not c.startswith(("main", "shm")), len(c), c))
    cols = [c for c in cols if host[c].notna().any()]
    axes = _panel_axes(cols)
    ranks = sorted(int(r) for r in host["rank"].unique()) if len(host) else []
    return [Series("host", c, label_of(c) if len(ranks) == 1 else f"{label_of(c)} r{r}", rank=r, x="elapsed",
                   yaxis=axes[_panel(c)], **_unit_kw(host, cols, c))  # type: ignore[arg-type]
            for c in cols for r in ranks]


_PANEL_TITLES = {"%": "utilization", "MiB/s": "bandwidth", "W": "power", "°C": "temperature", "MHz": "clock"}


def panels_figure(title: str, frames: dict[str, pd.DataFrame], specs: list[Series], t0: float, live: bool = False,
                  axis_titles: dict[str, str] | None = None, xaxis_title: str = "seconds since start") -> Fig:
    """One panel per y axis (per unit), stacked, sharing the x axis."""
    axes = sorted({s.yaxis for s in specs}, key=lambda a: int(a[1:] or 1))
    n = max(len(axes), 1)
    fig = base_figure(title, height=170 + 130 * n, xaxis_title=xaxis_title)
    gap = 0.06
    h = (1 - gap * (n - 1)) / n
    title_by_axis = {s.yaxis: _panel(s.col) if _by_process(s.col) else
                     OWN_PANEL.get(s.col, "memory" if unit_of(s.col) == "bytes" else unit_of(s.col)) for s in specs}
    title_by_axis.update(axis_titles or {})
    unit_by_axis = {s.yaxis: s.unit for s in specs if s.unit}
    for i, ax in enumerate(axes):
        top = 1 - i * (h + gap)
        name = "yaxis" if ax == "y" else f"yaxis{ax[1:]}"
        title = title_by_axis[ax]
        spec: dict[str, object] = {**AXIS, "domain": [max(top - h, 0), top], "anchor": "x", "title": {"text": title}}
        if title.startswith("log"):
            spec.update(type="log", title={"text": title.removeprefix("log ")})
        unit = unit_by_axis.get(ax, "")
        if unit and not title.startswith("log"):
            spec.update(unit_axis(unit))
            if title == unit:  # the unit is on every tick: the panel's title says what it measures
                spec["title"] = {"text": _PANEL_TITLES.get(unit, "")}
        fig.update_layout({name: spec})
    for s in specs:
        add_series(fig, s, *series_xy(s, frames.get(s.table, pd.DataFrame()), t0))
    if not specs and live:
        waiting_figure(fig)
    return fig
