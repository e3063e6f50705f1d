"""Stability views: loss with detected spikes, grad norm, loss scale, skipped and non-finite
steps, OOMs, allocator retries, fragmentation, and a row of traffic lights summarizing them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from dash import html
from gpudash.layouts.common import base_figure, waiting_figure
from gpudash.layouts.fig import Fig
from gpudash.layouts.series import Series, add_series, series_xy, spike_mask

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


def loss_series(steps: pd.DataFrame, ranks: list[int]) -> list[Series]:
    if not _has(steps, "loss"):
        return []
    out = []
    for r in ranks:
        sfx = f" r{r}" if len(ranks) > 1 else ""
        out += [Series("steps", "loss", "loss" + sfx, rank=r, color="#1f77b4" if len(ranks) == 1 else None),
                Series("steps", "loss", "spike" + sfx, rank=r, fn="spike", style="markers")]
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
        specs.append(Series("memory", "reserved_bytes", "fragmentation (cache / reserved)", rank=rank, fn="frag",
                            yaxis=axis("%")))
    return specs, titles


def _count(df: pd.DataFrame, cols: tuple[str, ...]) -> int | None:
    found = [c for c in cols if _has(df, c)]
    if not found:
        return None
    vals = sum(pd.to_numeric(df[c], errors="coerce").fillna(0).to_numpy() for c in found)
    return int(np.count_nonzero(vals))


def stability_lights(steps: pd.DataFrame, memory: pd.DataFrame, events: pd.DataFrame) -> list[Light]:
    """Traffic lights: green = fine, amber = look at it, red = act, grey = not recorded."""
    lights: list[Light] = []
    n = len(steps)
    if _has(steps, "loss"):
        loss = pd.to_numeric(steps["loss"], errors="coerce").to_numpy()
        spikes = int(spike_mask(loss[np.isfinite(loss)]).sum())
        lights.append(("loss spikes", "green" if spikes == 0 else "amber" if spikes <= 2 else "red",
                       f"{spikes} spike(s) in {n} steps"))
    else:
        lights.append(("loss spikes", "grey", "loss not logged"))
    bad = _count(steps, _NONFINITE + _SKIPPED)
    for col in _CUMULATIVE:
        if _has(steps, col):
            bad = (bad or 0) + int(pd.to_numeric(steps[col], errors="coerce").max())
    if _has(steps, "loss"):
        nonfinite_loss = int((~np.isfinite(pd.to_numeric(steps["loss"], errors="coerce").dropna())).sum())
        bad = (bad or 0) + nonfinite_loss
    if bad is None:
        lights.append(("non-finite / skipped", "grey", "not recorded"))
    else:
        share = bad / max(n, 1)
        lights.append(("non-finite / skipped", "green" if bad == 0 else "amber" if share < 0.05 else "red",
                       f"{bad} step(s)"))
    ooms = int((events["kind"] == "oom").sum()) if len(events) and "kind" in events else 0
    for col in _OOMS:
        if _has(memory, col):
            ooms = max(ooms, int(pd.to_numeric(memory[col], errors="coerce").max()))
    lights.append(("OOMs", "green" if ooms == 0 else "red", f"{ooms} OOM(s)"))
    retry_col = next((c for c in _RETRIES if _has(memory, c)), None)
    if retry_col:
        retries = int(pd.to_numeric(memory[retry_col], errors="coerce").max())
        lights.append(("allocator retries", "green" if retries == 0 else "amber" if retries < 10 else "red",
                       f"{retries} cudaMalloc retries"))
    else:
        lights.append(("allocator retries", "grey", "no allocator data"))
    if _has(memory, "fragmentation_pct"):
        frag_pct = float(pd.to_numeric(memory["fragmentation_pct"], errors="coerce").dropna().iloc[-1])
        lights.append(("fragmentation", "green" if frag_pct < 20 else "amber" if frag_pct < 40 else "red",
                       f"{frag_pct:.0f} % of reserved memory is split free blocks"))
    elif _has(memory, "reserved_bytes") and _has(memory, "allocated_bytes"):
        last = memory.dropna(subset=["reserved_bytes", "allocated_bytes"]).iloc[-1]
        res = float(last["reserved_bytes"])
        frag = 0.0 if res <= 0 else max(0.0, res - float(last["allocated_bytes"])) / res
        lights.append(("fragmentation", "green" if frag < 0.2 else "amber" if frag < 0.4 else "red",
                       f"{100 * frag:.0f} % of reserved memory is cached, not allocated"))
    else:
        lights.append(("fragmentation", "grey", "no allocator data"))
    return lights


def lights_row(lights: list[Light]) -> list[Any]:
    """Dash components for the lights (text only)."""
    return [html.Span([html.Span(className=f"light light-{color}"), html.B(name), html.Span(f" {detail}")],
                      className="light-item", title=detail) for name, color, detail in lights]
