"""Throughput views: step time (median and p95 over a window), samples/s, tokens/s, MFU and
the phase breakdown, so an input-bound run looks different from a compute-bound one.

The numbers in the header are the run's facts (:mod:`gpudash.analysis.rates`, via ``facts.recent`` and
``facts.headline``), and what bounds the step is the bottleneck verdict's (``facts.bound``,
:mod:`gpudash.analysis.bottleneck`); this module only draws and words them."""

from __future__ import annotations

from typing import Any

import pandas as pd
from gpudash.analysis.phases import phase_columns
from gpudash.analysis.rates import Throughput, fmt_mfu, fmt_rate
from gpudash.analysis.verdict import fmt_pct
from gpudash.server.layouts.common import base_figure, fmt_s, time_unit, unit_axis, waiting_figure
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.series import WINDOW, Series, add_series, series_xy

__all__ = [
    "PHASE_COLORS",
    "bound_text",
    "phase_figure",
    "phase_series",
    "rate_series",
    "rates_figure",
    "step_time_figure",
    "step_time_series",
    "stats_lines",
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
    return _drawn(fig, steps, specs, live, "samples/tokens not recorded (pass monitor.step(samples=..., tokens=...))")


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
    return _drawn(fig, steps, specs, live, "no phases recorded (wrap parts of the step in monitor.phase(name))")


def _drawn(fig: Fig, steps: pd.DataFrame, specs: list[Series], live: bool, missing: str) -> Fig:
    """``fig`` with ``specs`` drawn from ``steps``; with none, says why: still waiting (``live``) or ``missing``."""
    for s in specs:
        add_series(fig, s, *series_xy(s, steps))
    if not specs:
        waiting_figure(fig, "waiting for the first records..." if live else missing)
    return fig


def throughput_stats(recent: Throughput | dict[str, Any] | None) -> dict[str, Any]:
    """The run's recent :class:`gpudash.analysis.rates.Throughput` (``facts.recent``, or its JSON) in the
    shape ``/api/runs/<id>/summary`` has always answered (``window``, ``median_s``, ``p95_s``, rates, ``mfu``,
    phases)."""
    if isinstance(recent, dict):
        recent = Throughput(**recent)
    if recent is None or not recent.steps:
        return {"window": 0}
    out: dict[str, Any] = {"window": recent.steps}
    if recent.step_time_median_s is None:
        return out
    out.update(median_s=recent.step_time_median_s, p95_s=recent.step_time_p95_s)
    for key in ("samples_per_s", "tokens_per_s", "mfu"):
        if getattr(recent, key) is not None:
            out[key] = getattr(recent, key)
    if recent.phases:
        out["phases"] = dict(recent.phases)
    return out


def stats_lines(facts: Any) -> list[str]:
    """The throughput header's items, rendered from the run's :class:`gpudash.analysis.facts.Facts`: the
    recent window (``facts.recent``), the whole run's rates and MFU (``facts.headline``, as the runs
    list, ``gpudash info`` and the report state them) and what bounds the step (``facts.bound``: the
    summary's bottleneck verdict, in its words)."""
    stats = throughput_stats(getattr(facts, "recent", None))
    if "median_s" not in stats:
        return ["no steps yet"]
    items = [f"step time median {fmt_s(stats['median_s'])}, p95 {fmt_s(stats['p95_s'])} "
             f"(last {stats['window']} steps)"]
    recent = [f"{fmt_rate(stats[k])} {k.removesuffix('_per_s')}/s" for k in ("samples_per_s", "tokens_per_s") if k in stats]
    if "mfu" in stats:
        recent.append(f"MFU {fmt_mfu(stats['mfu'])}")
    if recent:
        items.append(", ".join(recent) + f" (last {stats['window']} steps)")
    head = facts.headline
    run = [f"{fmt_rate(head[k])} {k.removesuffix('_per_s')}/s" for k in ("samples_per_s", "tokens_per_s")
           if head.get(k) is not None]
    run.append(f"MFU {fmt_mfu(head['mfu'])}" if head.get("mfu") is not None else "MFU: device peak unknown")
    items.append("whole run: " + ", ".join(run))
    if stats.get("phases"):
        top = max(stats["phases"].items(), key=lambda kv: kv[1])
        items.append(f"largest phase: {top[0]} {100 * top[1]:.0f} %")
    bound = getattr(facts, "bound", None)
    if bound is not None:
        items.append(bound_text(bound))
    energy = getattr(facts, "energy", None)
    if energy is not None:  # as gpudash info and the report state it
        from gpudash.analysis.energy import energy_text

        items.append("energy: " + energy_text(energy))
    return items


def bound_text(bound: Any) -> str:
    """The header's line for ``facts.bound`` (:class:`gpudash.analysis.bottleneck.Bound`): the verdict's title,
    its share of the step and where."""
    where = f"step {bound.first_step}" if bound.first_step == bound.last_step else \
        f"steps {bound.first_step}–{bound.last_step}"
    return f"{bound.title} ({fmt_pct(bound.share_of_step)} of the step, {where})"
