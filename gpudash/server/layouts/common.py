"""Shared bits of every view: units, "not recorded because..." lines, empty figures.

Everything a view shows from a run file (names, messages, reasons) goes into
Dash components as text children, never as HTML.
"""

from __future__ import annotations

import html as _html
import math
from typing import Any

import pandas as pd
from dash import html
from gpudash.server.layouts.fig import Fig
from gpudash.units import byte_unit, fmt_duration

__all__ = [
    "AXIS",
    "UIREVISION",
    "base_figure",
    "byte_unit",
    "hover_template",
    "time_unit",
    "fmt_s",
    "note",
    "plot_text",
    "recorded_reason",
    "source_reason",
    "waiting_figure",
]

#: Constant ``uirevision``: zoom and pan survive live updates and rebuilds.
UIREVISION = "gpudash"

#: Where each view's data comes from: Monitor source names whose ``unavailable_<name>`` meta explains a gap.
SOURCES: dict[str, tuple[str, ...]] = {
    "allocator": ("allocator", "cuda", "memory_stats"),
    "memory": ("memory",),
    "device": ("nvml", "device", "gpm"),
    "host": ("host", "psutil"),
    "stacks": ("pyspy", "py_spy", "stacks"),
    "snapshots": ("snapshot", "snapshots", "allocator"),
    "activations": ("activations", "memory"),
    "cuda_timing": ("cuda_timing", "cuda_timer"),
}

_DEFAULT_REASON: dict[str, str] = {
    "allocator": "allocator data not available",
    "memory": "memory by category not recorded (call monitor.watch(model, optimizer))",
    "device": "device metrics (NVML) not available",
    "host": "host metrics not recorded (MonitorOptions.host_hz=0)",
    "stacks": "Python stacks not recorded (py-spy off: MonitorOptions.stacks_hz=0)",
    "snapshots": "no snapshot recorded",
    "activations": "activations per module not recorded",
}


def recorded_reason(source: str, meta: dict[str, Any], events: pd.DataFrame | None = None) -> str | None:
    """Why ``source`` records nothing, as the collectors noted it (meta or a ``collector_unavailable`` event);
    None when they noted nothing (yet)."""
    names = SOURCES.get(source, (source,))
    for name in names:
        reason = meta.get(f"unavailable_{name}")
        if reason:
            return f"{name}: {reason}"
    if events is not None and len(events) and "kind" in events:
        ev = events[events["kind"] == "collector_unavailable"]
        for _, row in ev.iterrows():
            data = row.get("data") if isinstance(row.get("data"), dict) else {}
            if str(data.get("source", "")) in names:
                return str(row.get("message") or "")
    return None


def source_reason(source: str, meta: dict[str, Any], events: pd.DataFrame | None = None) -> str:
    """One line saying why ``source`` recorded nothing (from the Monitor's own notes when it left any)."""
    noted = recorded_reason(source, meta, events)
    if noted is not None:
        return noted
    default = _DEFAULT_REASON.get(source, f"{source} not recorded")
    device = str(meta.get("device") or "")
    if source in ("allocator", "device", "snapshots") and device and not device.startswith("cuda"):
        return f"no GPU ({device}): {default}"
    return default


def note(text: str, id: str | None = None) -> html.Div:
    """A one-line reason shown in place of a chart (text, never HTML)."""
    kw: dict[str, Any] = {"id": id} if id else {}
    return html.Div(text, className="note", **kw)


def plot_text(value: object, limit: int = 300) -> str:
    """Text from a run file made safe for plotly labels (plotly reads a few HTML tags in them)."""
    text = str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return _html.escape(text, quote=False)


def fmt_s(s: float | None) -> str:
    return fmt_duration(s)


def time_unit(typical_s: float | None) -> tuple[str, float]:
    """``s``, ``ms`` or ``µs`` for durations around ``typical_s`` seconds: ``(name, seconds per unit)``."""
    if typical_s is None or not math.isfinite(typical_s) or typical_s >= 1.0:
        return "s", 1.0
    if typical_s >= 1e-3:
        return "ms", 1e-3
    return "µs", 1e-6


def hover_template(unit: str) -> str:
    """Hover text of a value already scaled to ``unit``: four significant digits, the unit named."""
    return f"%{{y:.4~g}} {unit}"


def unit_axis(unit: str) -> dict[str, Any]:
    """Axis settings for values already scaled to ``unit``: plain numbers (no SI "k"/"M"), unit on every tick."""
    return {"tickformat": ",~r" if unit == "B" else ",", "ticksuffix": f" {unit}", "exponentformat": "none"}


_COLORWAY = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
             "#17becf"]
AXIS = {"gridcolor": "#ececec", "zeroline": False, "linecolor": "#bbb", "automargin": True}


def base_figure(title: str, *, height: int = 300, yaxis_title: str = "", xaxis_title: str = "step",
                bytes_axis: str = "") -> Fig:
    """``bytes_axis``: the binary unit (from :func:`byte_unit`) the y values were scaled to, named on every tick."""
    yaxis: dict[str, Any] = {**AXIS, "title": {"text": yaxis_title}}
    if bytes_axis:
        yaxis.update(unit_axis(bytes_axis))
    return Fig({
        "title": {"text": title, "x": 0.01, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 60, "r": 30, "t": 36, "b": 36},
        "uirevision": UIREVISION,
        # transparent: the page's theme (light or dark, gpudash/server/layouts/style.py) shows through
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "colorway": _COLORWAY,
        # the legend sits under the x axis title (its top anchored below the plot's automargins)
        "legend": {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "font": {"size": 11}},
        "hovermode": "x unified",
        "xaxis": {**AXIS, "title": {"text": xaxis_title}},
        "yaxis": yaxis,
    })


def waiting_figure(fig: Fig, text: str = "waiting for the first records...") -> Fig:
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font={"color": "#888"})
    return fig
