"""Memory views: by category over steps, the breakdown at the cursor, the allocator segment map,
and activations per module.

The category stack of a step describes one moment (the end of its largest forward, see
``gpudash/collectors/categories.py``), so it never rises above the step's measured peak
(``peak_bytes``), drawn over it as a line with the estimator's per-step prediction of that same
quantity. Where some parameters are frozen (LoRA on a frozen base), the parameters are two bands:
frozen and trainable. The horizontal lines are the limit the OOMs were judged against (the run's pre-flight
capacity: the device, a memory cap or the CPU budget) and the device total when it differs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from gpudash.analysis import memory_parts
from gpudash.analysis.capacity import capacity, device_bytes
from gpudash.analysis.memory_parts import has_frozen_params
from gpudash.server.layouts.common import base_figure, byte_unit, plot_text, unit_axis, waiting_figure
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.series import Series, add_series, series_xy
from gpudash.store.schema import MEMORY_PARTS
from gpudash.units import human_bytes

__all__ = [
    "CATEGORIES",
    "PARAM_SPLIT",
    "activations_figure",
    "capacity_lines",
    "memory_at",
    "memory_at_figure",
    "memory_figure",
    "memory_series",
    "segment_map_figure",
]

#: (column, label, colour, transform): stacked bottom to top.
CATEGORIES: tuple[tuple[str, str, str, str], ...] = (
    ("params_bytes", "parameters", "#1f77b4", "raw"),
    ("grads_bytes", "gradients", "#ff7f0e", "raw"),
    ("optimizer_bytes", "optimizer state", "#2ca02c", "raw"),
    ("activations_bytes", "activations", "#d62728", "raw"),
    ("other_bytes", "other (allocated)", "#9467bd", "raw"),
    ("reserved_bytes", "allocator cache", "#c7c7c7", "cache"),
    ("non_pytorch_bytes", "other processes / context", "#8c564b", "raw"),
)
#: (column, label, colour): lines over the stack, same quantity each step (measured, predicted).
PEAK_LINES: tuple[tuple[str, str, str], ...] = (
    ("peak_bytes", "measured peak", "#111111"),
    ("predicted_peak_bytes", "estimate (peak)", "#7f7f7f"),
)
STATE_COLORS = {"active_allocated": "#d62728", "active_pending_free": "#ff9896", "inactive": "#c7c7c7"}


def _memory_top(memory: pd.DataFrame) -> float | None:
    """The largest byte value the memory chart draws: the stack's top or a peak line, whichever is higher."""
    if not len(memory):
        return None
    cols = [c for c in (*MEMORY_PARTS, "non_pytorch_bytes") if c in memory]
    tops = [float(np.nanmax(np.nansum(memory[cols].to_numpy(dtype=float), axis=1), initial=0.0))] if cols else []
    for c in ("reserved_bytes", "allocated_bytes", *(c for c, *_ in PEAK_LINES)):
        if c in memory and memory[c].notna().any():
            tops.append(float(np.nanmax(memory[c].to_numpy(dtype=float))))
    return max(tops) if tops else None


#: The parameters band split in two when some are frozen: (column, label, colour, transform).
PARAM_SPLIT: tuple[tuple[str, str, str, str], ...] = (
    ("params_bytes", "parameters (frozen)", "#aec7e8", "frozen"),
    ("trainable_params_bytes", "parameters (trainable)", "#1f77b4", "raw"),
)


def _categories(memory: pd.DataFrame) -> tuple[tuple[str, str, str, str], ...]:
    if not has_frozen_params(memory):
        return CATEGORIES
    return PARAM_SPLIT + CATEGORIES[1:]


def memory_series(memory: pd.DataFrame, rank: int = 0) -> list[Series]:
    unit, scale = byte_unit(_memory_top(memory))
    kw = {"rank": rank, "unit": unit, "scale": scale}
    out = []
    for col, label, color, fn in _categories(memory):
        need = memory_parts.DERIVED[_KEY[fn]] if fn in _KEY else (col,)
        if all(c in memory and memory[c].notna().any() for c in need):
            out.append(Series("memory", col, label, fn=fn, style="area", color=color, **kw))  # type: ignore[arg-type]
    if not out and "allocated_bytes" in memory and memory["allocated_bytes"].notna().any():
        out.append(Series("memory", "allocated_bytes", "allocated", style="area", color="#1f77b4", **kw))  # type: ignore[arg-type]
    for col, label, color in PEAK_LINES:
        if col in memory and memory[col].notna().any():
            out.append(Series("memory", col, label, style="line", color=color, **kw))  # type: ignore[arg-type]
    return out


def _first_num(*values: Any) -> float | None:
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if np.isfinite(f) and f > 0:
            return f
    return None


def capacity_lines(meta: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(label, bytes, dash) of the limit the run's OOMs were judged against (the pre-flight
    capacity: a CPU budget, a memory cap or the device), the device capacity when it differs,
    and the estimator's pre-flight prediction (runs without a per-step one)."""
    estimate: dict[str, Any] = meta["estimate"] if isinstance(meta.get("estimate"), dict) else {}
    out = []
    cap = device_bytes(meta)
    limit = capacity(meta)
    if cap:
        out.append(("device capacity", cap, "solid"))
    if limit and limit.bytes != cap:
        out.append((limit.kind if limit.kind != "device" else "capacity", limit.bytes, "dot"))
    pred = _first_num(estimate.get("peak_bytes"))
    if pred:
        out.append(("estimate (peak)", pred, "dash"))
    return out


def memory_figure(memory: pd.DataFrame, meta: dict[str, Any], events: pd.DataFrame, rank: int = 0,
                  specs: list[Series] | None = None, live: bool = False) -> tuple[Fig, list[Series]]:
    """Stacked area of memory by category against capacity / budget / prediction, OOMs marked."""
    specs = memory_series(memory, rank) if specs is None else specs
    unit, scale = (specs[0].unit, specs[0].scale) if specs else byte_unit(None)
    fig = base_figure("Memory by category", height=340, yaxis_title="memory", bytes_axis=unit)
    for s in specs:
        add_series(fig, s, *series_xy(s, memory))
    per_step = {s.col for s in specs}
    for label, value, dash in capacity_lines(meta):
        if label == "estimate (peak)" and "predicted_peak_bytes" in per_step:
            continue  # drawn per step, at each step's real shape
        fig.add_hline(value / scale, dash=dash, text=f"{label} {human_bytes(value, 2)}")
    if len(events) and "kind" in events:
        for _, ev in events[events["kind"] == "oom"].iterrows():
            if pd.notna(ev.get("step")):
                fig.add_vline(float(ev["step"]), color="#d62728", dash="dot", text="OOM")
    if not specs and live:
        waiting_figure(fig)
    return fig, specs


#: The chart's transforms that draw a derived column (:mod:`gpudash.analysis.memory_parts`), by its key.
_KEY = {"frozen": "frozen_params_bytes", "cache": "cache_bytes"}
#: The breakdown's keys (:func:`gpudash.analysis.memory_parts.memory_at`) by the chart's label.
_LABELS = {_KEY.get(fn, col): label for col, label, _, fn in PARAM_SPLIT + CATEGORIES}


def memory_at(memory: pd.DataFrame, step: int | None, rank: int = 0) -> dict[str, float]:
    """The breakdown at ``step`` (:func:`gpudash.analysis.memory_parts.memory_at`) by the chart's labels."""
    return {_LABELS.get(k, k): v for k, v in memory_parts.memory_at(memory, step, rank).items()}


def memory_at_figure(values: dict[str, float]) -> Fig:
    step = values.get("step")
    peak = values.get("peak")
    where = []
    if step is not None and np.isfinite(step):
        where.append(f"step {int(step)}")
    if peak is not None:
        where.append(f"measured peak {human_bytes(peak, 2)}")
    title = "Memory at the cursor" + (f" ({', '.join(where)})" if where else "")
    colors = {label: color for _, label, color, _ in PARAM_SPLIT + CATEGORIES}
    labels = [k for k in values if k not in ("step", "peak")]
    unit, scale = byte_unit(max((values[k] for k in labels), default=None))
    fig = base_figure(title, height=300, xaxis_title="", yaxis_title="memory", bytes_axis=unit)
    fig.add_trace({"type": "bar", "x": labels, "y": [values[k] / scale for k in labels],
                   "marker": {"color": [colors.get(k, "#888") for k in labels]},
                   "text": [human_bytes(values[k]) for k in labels], "textposition": "auto", "hoverinfo": "x+text"})
    fig.update_layout(hovermode="closest", showlegend=False)
    return fig


def _col(df: pd.DataFrame, *names: str) -> str | None:
    return next((n for n in names if n in df.columns), None)


def _frame_text(v: Any) -> str:
    if isinstance(v, list | tuple):
        v = v[0] if v else ""
    if isinstance(v, dict):
        return f"{v.get('filename', '?')}:{v.get('line', '?')} {v.get('name', '')}"
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)


def segment_map_figure(mm: Any, max_segments: int = 60) -> Fig:
    """Allocator segments as bars sized by bytes, blocks coloured by state, the largest free block called out.

    At most ``max_segments`` (the largest) are drawn, and the chart says so; its free and reserved totals
    are over every segment."""
    segs: pd.DataFrame = getattr(mm, "segments", pd.DataFrame())
    blocks: pd.DataFrame = getattr(mm, "blocks", pd.DataFrame())
    step = getattr(mm, "step", None)
    reason = getattr(mm, "reason", None)
    title = "Allocator segment map" + (f" (step {plot_text(step)})" if step is not None else "") \
        + (f" - {plot_text(reason)}" if reason else "")
    fig = base_figure(title, height=380, xaxis_title="offset within segment", yaxis_title="")
    fig.update_layout(hovermode="closest", barmode="overlay", margin={"l": 60, "r": 30, "t": 74, "b": 36})
    size_c = _col(blocks, "size", "bytes", "total_size")
    state_c = _col(blocks, "state")
    if not len(segs) or not len(blocks) or size_c is None:
        return waiting_figure(fig, "snapshot has no segments")
    seg_addr = _col(segs, "address", "segment_address")
    seg_size = _col(segs, "total_size", "size", "bytes")
    seg_id = _col(blocks, "segment", "segment_index", "segment_id", "seg")
    blocks = blocks.copy()
    if seg_id is None and seg_addr and seg_size and "address" in blocks:
        starts = segs[seg_addr].to_numpy(dtype=float)
        order = np.argsort(starts)
        pos = np.searchsorted(starts[order], blocks["address"].to_numpy(dtype=float), side="right") - 1
        blocks["_seg"] = order[np.clip(pos, 0, len(order) - 1)]
    elif seg_id is not None:
        blocks["_seg"] = blocks[seg_id]
    else:
        blocks["_seg"] = 0
    sizes = segs[seg_size].to_numpy(dtype=float) if seg_size else np.zeros(len(segs))
    unit, scale = byte_unit(float(sizes.max()) if len(sizes) else None)
    fig.update_xaxes(**unit_axis(unit))
    keep = list(np.argsort(-sizes)[:max_segments]) if len(segs) else []
    all_blocks = blocks
    blocks = blocks[blocks["_seg"].isin(keep)]
    labels = {i: f"seg {i} ({human_bytes(sizes[i])})" for i in keep}
    if "address" in blocks:
        blocks = blocks.sort_values(["_seg", "address"])
    blocks["_offset"] = blocks.groupby("_seg")[size_c].cumsum() - blocks[size_c]
    frame_c = _col(blocks, "frame", "frames", "top_frame")
    states = blocks[state_c].astype(str) if state_c else pd.Series("active_allocated", index=blocks.index)
    for state in sorted(states.unique()):
        b = blocks[states == state]
        hover = [f"{plot_text(state)} {human_bytes(sz)}" + (f"<br>{plot_text(_frame_text(fr))}" if frame_c else "")
                 for sz, fr in zip(b[size_c], b[frame_c] if frame_c else [None] * len(b), strict=False)]
        fig.add_trace({"type": "bar", "orientation": "h", "y": [labels[int(s)] for s in b["_seg"]],
                       "x": (b[size_c].astype(float) / scale).tolist(), "base": (b["_offset"].astype(float) / scale).tolist(),
                       "name": plot_text(state),
                       "marker": {"color": STATE_COLORS.get(state, "#7f7f7f"), "line": {"width": 0.5, "color": "#fff"}},
                       "hovertext": hover, "hoverinfo": "text"})
    # totals over every segment, not only those drawn (the map's own facts when it carries them)
    all_states = all_blocks[state_c].astype(str) if state_c else pd.Series("active_allocated", index=all_blocks.index)
    all_free = all_blocks.loc[all_states == "inactive", size_c].astype(float)
    total_free = float(getattr(mm, "free_bytes", all_free.sum()))
    largest = float(getattr(mm, "largest_free_bytes", all_free.max() if len(all_free) else 0.0))
    shown = f"all {len(segs)} segments" if len(keep) == len(segs) else \
        f"showing the {len(keep)} largest of {len(segs)} segments"
    fig.add_annotation(text=f"{shown}<br>free in all {len(segs)}: {human_bytes(total_free)} of "
                            f"{human_bytes(float(sizes.sum()))} reserved · largest free block {human_bytes(largest)}",
                       showarrow=False, xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom",
                       align="left", font={"size": 11, "color": "#666"})
    free = blocks[states == "inactive"] if state_c else blocks.iloc[:0]
    if len(free) and float(free[size_c].max()) >= largest:
        big = free.loc[free[size_c].idxmax()]
        fig.add_annotation(x=(float(big["_offset"]) + float(big[size_c]) / 2) / scale, y=labels[int(big["_seg"])],
                           text=f"largest free block {human_bytes(float(big[size_c]))}",
                           showarrow=True, arrowhead=2, ax=40, ay=-30)
    # fixed margins, no automargin (Plotly draws a figure whose margins it grows twice: half of this chart's
    # draw): room for the longest segment label on the left, the ticks, axis title and legend below
    fig.update_layout(margin={"l": 16 + 7 * max((len(v) for v in labels.values()), default=8), "r": 30, "t": 74,
                              "b": 84})
    fig.update_xaxes(automargin=False)
    fig.update_yaxes(autorange="reversed", automargin=False)
    return fig


def activations_figure(acts: pd.DataFrame, step: int | None = None, rank: int = 0) -> Fig:
    """Activations saved for backward per module in the sampled step at or before ``step``."""
    a = acts[acts["rank"] == rank] if "rank" in acts else acts
    if step is not None:
        a = a[a["step"] <= step]
    if not len(a):
        fig = base_figure("Activations per module", height=300, xaxis_title="", yaxis_title="saved for backward")
        fig.update_layout(hovermode="closest", showlegend=False)
        return waiting_figure(fig, "no sampled step at or before the cursor" if step is not None else "no sampled step yet")
    last = int(a["step"].max())
    a = a[a["step"] == last]
    unit, scale = byte_unit(float(a["bytes"].max()))
    fig = base_figure("Activations per module", height=300, xaxis_title="", yaxis_title="saved for backward",
                      bytes_axis=unit)
    fig.update_layout(hovermode="closest", showlegend=False)
    fig.update_xaxes(type="category")  # module names such as "0", "1" (nn.Sequential) are names, not numbers
    fig.update_layout(title={"text": f"Activations per module (step {last}, total "
                                     f"{human_bytes(float(a['bytes'].sum()))})"})
    fig.add_trace({"type": "bar", "x": [plot_text(m) for m in a["module"]], "y": (a["bytes"].astype(float) / scale).tolist(),
                   "text": [human_bytes(float(b)) for b in a["bytes"]], "hoverinfo": "x+text",
                   "marker": {"color": "#d62728"}})
    return fig
