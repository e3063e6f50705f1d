"""Throughput views: step time (median and p95 over a window), samples/s, tokens/s, MFU and
the phase breakdown, so an input-bound run looks different from a compute-bound one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from gpudash.analysis.phases import phase_columns
from gpudash.server.layouts.common import base_figure, fmt_num, fmt_s, time_unit, unit_axis, waiting_figure
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.series import WINDOW, Series, add_series, series_xy

__all__ = [
    "PHASE_COLORS",
    "device_peak_flops",
    "mfu_meta",
    "phase_figure",
    "phase_series",
    "rate_series",
    "rates_figure",
    "step_time_figure",
    "step_time_series",
    "throughput_stats",
]

PHASE_COLORS = {"data": "#8c564b", "forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c",
                "offload": "#9467bd"}


def seconds_unit(steps: pd.DataFrame) -> tuple[str, float]:
    """The unit step durations are drawn in: by the median step time (``ms`` for 5 ms steps)."""
    if "duration_s" not in steps or not steps["duration_s"].notna().any():
        return "s", 1.0
    return time_unit(float(pd.to_numeric(steps["duration_s"], errors="coerce").median()))


def _seconds_axis(fig: Fig, specs: list[Series]) -> None:
    fig.update_layout(yaxis=unit_axis(specs[0].unit if specs else "s"))


def step_time_series(steps: pd.DataFrame, ranks: list[int]) -> list[Series]:
    if "duration_s" not in steps or not steps["duration_s"].notna().any():
        return []
    unit, scale = seconds_unit(steps)
    out = []
    for r in ranks:
        suffix = f" r{r}" if len(ranks) > 1 else ""
        out += [Series("steps", "duration_s", f"step time{suffix}", rank=r, color="#aec7e8" if len(ranks) == 1 else None,
                       unit=unit, scale=scale),
                Series("steps", "duration_s", f"median ({WINDOW}){suffix}", rank=r, fn="median",
                       color="#1f77b4" if len(ranks) == 1 else None, unit=unit, scale=scale),
                Series("steps", "duration_s", f"p95 ({WINDOW}){suffix}", rank=r, fn="p95",
                       color="#ff7f0e" if len(ranks) == 1 else None, unit=unit, scale=scale)]
    return out


def step_time_figure(steps: pd.DataFrame, specs: list[Series], live: bool = False) -> Fig:
    fig = base_figure("Step time", yaxis_title="step time")
    _seconds_axis(fig, specs)
    for s in specs:
        add_series(fig, s, *series_xy(s, steps))
    if not specs and live:
        waiting_figure(fig)
    return fig


def rate_series(steps: pd.DataFrame, ranks: list[int], smooth: float = 0.0) -> list[Series]:
    """samples/s (left axis) and tokens/s (right); with ``smooth`` > 0 each drawn faint under its EMA."""
    out = []
    for col, label, axis, color in (("samples", "samples/s", "y", "#1f77b4"), ("tokens", "tokens/s", "y2", "#ff7f0e")):
        if col in steps and steps[col].notna().any():
            for r in ranks:
                sfx = f" r{r}" if len(ranks) > 1 else ""
                c = color if len(ranks) == 1 else None
                out.append(Series("steps", col, label + sfx, rank=r, fn="rate", yaxis=axis, unit=label,
                                  color=(_FAINT[color] if smooth > 0 else color) if c else None))
                if smooth > 0:
                    out.append(Series("steps", col, f"{label} (EMA {smooth:g}){sfx}", rank=r, fn="rate_ema",
                                      yaxis=axis, unit=label, smooth=smooth, color=c))
    return out


_FAINT = {"#1f77b4": "#c6dbef", "#ff7f0e": "#fdd0a2"}


def rates_figure(steps: pd.DataFrame, specs: list[Series], live: bool = False) -> Fig:
    fig = base_figure("Samples/s and tokens/s", yaxis_title="samples/s")
    fig.update_layout(yaxis2={"title": {"text": "tokens/s"}, "overlaying": "y", "side": "right", "showgrid": False,
                              "automargin": True, "zeroline": False, "rangemode": "tozero"},
                      yaxis={"rangemode": "tozero"})
    for s in specs:
        add_series(fig, s, *series_xy(s, steps))
    if not specs:
        waiting_figure(fig, "waiting for the first records..." if live else
                       "samples/tokens not recorded (pass monitor.step(samples=..., tokens=...))")
    return fig


#: Above this many steps on screen the phase bars become a stacked area (bars of one pixel cost far more to draw).
MAX_BARS = 300


def phase_series(steps: pd.DataFrame, rank: int = 0, meta: dict[str, Any] | None = None) -> list[Series]:
    n = int((steps["rank"] == rank).sum()) if "rank" in steps and len(steps) else len(steps)
    style = "bar" if n <= MAX_BARS else "area"
    unit, scale = seconds_unit(steps)
    return [Series("steps", c, c.removesuffix("_s"), rank=rank, style=style, stack="phases",
                   color=PHASE_COLORS.get(c.removesuffix("_s")), unit=unit, scale=scale)
            for c in phase_columns(steps, meta)]


def phase_figure(steps: pd.DataFrame, specs: list[Series], live: bool = False) -> Fig:
    fig = base_figure("Phase breakdown per step", yaxis_title="time in phase")
    _seconds_axis(fig, specs)
    fig.update_layout(barmode="stack", bargap=0)
    for s in specs:
        add_series(fig, s, *series_xy(s, steps))
    if not specs:
        waiting_figure(fig, "waiting for the first records..." if live else
                       "no phases recorded (wrap parts of the step in monitor.phase(name))")
    return fig


def _meta_num(meta: dict[str, Any], *keys: str) -> float | None:
    for src in (meta, meta.get("estimate") or {}, meta.get("config") or {}):
        if not isinstance(src, dict):
            continue
        for k in keys:
            try:
                v = float(src[k])
            except (KeyError, TypeError, ValueError):
                continue
            if np.isfinite(v) and v > 0:
                return v
    return None


#: Dense bf16 tensor-core peak FLOP/s by device name (vendor data sheets; SXM parts where two exist).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
    ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("V100", 125e12),
)


def device_peak_flops(meta: dict[str, Any]) -> float | None:
    """The device's bf16 peak from the run's meta or the table above (None on a CPU or unknown card)."""
    peak = _meta_num(meta, "peak_flops", "device_peak_flops")
    if peak:
        return peak
    if not str(meta.get("device") or "").startswith("cuda"):
        return None
    name = str(meta.get("device_name") or "")
    return next((p for key, p in PEAK_BF16_FLOPS if key in name), None)


def mfu_meta(meta: dict[str, Any]) -> dict[str, float]:
    """The two numbers MFU needs from the run's meta (device peak FLOP/s, FLOPs per token), when known."""
    out = {}
    peak = device_peak_flops(meta)
    fpt = _meta_num(meta, "flops_per_token")
    if peak:
        out["peak_flops"] = peak
    if fpt:
        out["flops_per_token"] = fpt
    return out


def throughput_stats(steps: pd.DataFrame, meta: dict[str, Any], window: int = WINDOW * 2) -> dict[str, Any]:
    """Headline numbers over the last ``window`` steps (of rank 0): medians, rates, MFU, phase shares."""
    s = steps
    if "rank" in s and len(s):
        s = s[s["rank"] == s["rank"].min()]
    s = s.tail(window)
    out: dict[str, Any] = {"window": len(s)}
    if not len(s) or "duration_s" not in s:
        return out
    dur = s["duration_s"].astype(float)
    out["median_s"] = float(dur.median())
    out["p95_s"] = float(dur.quantile(0.95))
    total = float(dur.sum())
    for col in ("samples", "tokens"):
        if col in s and s[col].notna().any() and total > 0:
            out[f"{col}_per_s"] = float(s[col].sum()) / total
    if "mfu" in s and s["mfu"].notna().any():
        out["mfu"] = float(s["mfu"].median())
    else:
        peak = device_peak_flops(meta)
        fpt = _meta_num(meta, "flops_per_token")
        if peak and fpt and out.get("tokens_per_s"):
            out["mfu"] = out["tokens_per_s"] * fpt / peak
    phases = phase_columns(s, meta)
    if phases and total > 0:
        out["phases"] = {c.removesuffix("_s"): float(s[c].sum()) / total for c in phases}
    return out


def stats_lines(stats: dict[str, Any]) -> list[str]:
    """The stats as short text items for the throughput header."""
    if "median_s" not in stats:
        return ["no steps yet"]
    items = [f"step time median {fmt_s(stats['median_s'])}, p95 {fmt_s(stats['p95_s'])} "
             f"(last {stats['window']} steps)"]
    if "samples_per_s" in stats:
        items.append(f"{fmt_num(stats['samples_per_s'])} samples/s")
    if "tokens_per_s" in stats:
        items.append(f"{fmt_num(stats['tokens_per_s'])} tokens/s")
    items.append(f"MFU {100 * stats['mfu']:.1f} %" if "mfu" in stats else "MFU: device peak unknown")
    if stats.get("phases"):
        top = max(stats["phases"].items(), key=lambda kv: kv[1])
        items.append(f"largest phase: {top[0]} {100 * top[1]:.0f} %")
        if stats["phases"].get("data", 0) > 0.3:
            items.append("input-bound: data loading takes over 30 % of the step")
    return items


__all__ += ["stats_lines"]
