"""Stability views: loss with detected spikes, grad norm, loss scale, skipped and non-finite
steps, OOMs, allocator retries, fragmentation, and a row of traffic lights summarizing them."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import html
from gpudash.analysis.facts import Facts
from gpudash.server.layouts.common import base_figure, waiting_figure
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.series import Series, add_series, series_xy

__all__ = ["Light", "lights_row", "loss_figure", "loss_series", "signal_series", "stability_lights"]

Light = tuple[str, str, str]  # (signal, "green" | "amber" | "red" | "grey", one-line detail)
_NONFINITE = ("nonfinite", "non_finite", "nonfinite_steps", "found_inf")
_SKIPPED = ("skipped", "skipped_step")
#: cumulative counters: a rise is an event (the trainer logs skipped_steps as a running total)
_CUMULATIVE = ("skipped_steps",)
_RETRIES = ("alloc_retries", "num_alloc_retries")
_OOMS = ("ooms", "num_ooms")


def _has(df: pd.DataFrame, col: str) -> bool:
    return col in df and bool(pd.to_numeric(df[col], errors="coerce").notna().any())


def loss_series(steps: pd.DataFrame, ranks: list[int], smooth: float = 0.0) -> list[Series]:
    """Loss per rank and its spike markers; with ``smooth`` > 0 the raw loss is drawn faint under its EMA."""
    if not _has(steps, "loss"):
        return []
    out = []
    one = len(ranks) == 1
    for r in ranks:
        sfx = f" r{r}" if len(ranks) > 1 else ""
        out.append(Series("steps", "loss", "loss" + sfx, rank=r,
                          color=("#c6dbef" if smooth > 0 else "#1f77b4") if one else None))
        if smooth > 0:
            out.append(Series("steps", "loss", f"loss (EMA {smooth:g}){sfx}", rank=r, fn="ema", smooth=smooth,
                              color="#1f77b4" if one else None))
        out.append(Series("steps", "loss", "spike" + sfx, rank=r, fn="spike", style="markers"))
    return out


def loss_figure(steps: pd.DataFrame, specs: list[Series], live: bool = False) -> Fig:
    fig = base_figure("Loss (spikes marked)", yaxis_title="loss")
    for s in specs:
        add_series(fig, s, *series_xy(s, steps))
    if not specs:
        waiting_figure(fig, "waiting for the first records..." if live else "no loss logged (monitor.log(loss=...))")
    return fig


def signal_series(steps: pd.DataFrame, memory: pd.DataFrame, rank: int = 0) -> tuple[list[Series], dict[str, str]]:
    """Series for the stability signals, and the title of each panel (y axis)."""
    specs: list[Series] = []
    titles: dict[str, str] = {}

    def axis(title: str) -> str:
        for ax, t in titles.items():
            if t == title:
                return ax
        ax = "y" if not titles else f"y{len(titles) + 1}"
        titles[ax] = title
        return ax

    if _has(steps, "grad_norm"):
        specs.append(Series("steps", "grad_norm", "grad norm", rank=rank, yaxis=axis("grad norm")))
    if _has(steps, "loss_scale"):
        specs.append(Series("steps", "loss_scale", "loss scale", rank=rank, yaxis=axis("log loss scale")))
    for col in (*_SKIPPED, *_NONFINITE, *_CUMULATIVE):
        if _has(steps, col):
            specs.append(Series("steps", col, col.replace("_", " "), rank=rank, yaxis=axis("count")))
    for col in (*_RETRIES, *_OOMS):
        if _has(memory, col):
            specs.append(Series("memory", col, col.removeprefix("num_").replace("_", " "), rank=rank,
                                yaxis=axis("count")))
    if _has(memory, "fragmentation_pct"):
        specs.append(Series("memory", "fragmentation_pct", "fragmentation (inactive split / reserved)", rank=rank,
                            yaxis=axis("%")))
    elif _has(memory, "reserved_bytes") and _has(memory, "allocated_bytes"):
        specs.append(Series("memory", "reserved_bytes", "allocator cache (reserved - allocated) / reserved", rank=rank, fn="frag",
                            yaxis=axis("%")))
    return specs, titles


def stability_lights(facts: Facts | None) -> list[Light]:
    """The run's traffic lights as :mod:`gpudash.analysis.facts` judged them (grey when the run is unreadable)."""
    if facts is None:
        return [(name, "grey", "run not readable") for name in
                ("loss spikes", "non-finite / skipped", "OOMs", "allocator retries", "fragmentation")]
    return [(li.signal, li.light, li.detail) for li in facts.lights]


def lights_row(lights: list[Light]) -> list[Any]:
    """Dash components for the lights (text only)."""
    return [html.Span([html.Span(className=f"light light-{color}"), html.B(name), html.Span(f" {detail}")],
                      className="light-item", title=detail) for name, color, detail in lights]
