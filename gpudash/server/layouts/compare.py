"""Compare runs: loss, throughput, memory and step time overlaid, and a table of each run's facts
(peak memory by category, median step time, tokens/s) relative to a chosen baseline run.

Every number in the table is a :class:`gpudash.analysis.facts.Facts` field of its run (the runs page,
``gpudash info`` and the report say the same); only the ratios to the baseline are computed here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from dash import dash_table, dcc, html
from gpudash.analysis.ranks import lowest_rank
from gpudash.analysis.rates import fmt_mfu, fmt_rate
from gpudash.server.layouts.common import (
    base_figure,
    byte_unit,
    fmt_s,
    hover_template,
    note,
    plot_text,
    time_unit,
    unit_axis,
)
from gpudash.server.layouts.data import RunView
from gpudash.server.layouts.downsample import MAX_POINTS, downsample_indices
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.links import href
from gpudash.server.layouts.memory import CATEGORIES
from gpudash.server.layouts.series import WINDOW
from gpudash.units import human_bytes

__all__ = ["COMPARE_GRAPHS", "compare_figures", "compare_page", "compare_rows", "total_memory"]

_CONFIG: Any = {"displaylogo": False}
#: Graph ids of the overlays, in page order.
COMPARE_GRAPHS = ("compare-loss", "compare-throughput", "compare-memory", "compare-step-time")
#: facts.peak_bytes keys by the memory chart's category label.
_PEAK_KEYS = {"parameters": "params", "gradients": "grads", "optimizer state": "optimizer",
              "activations": "activations"}


def total_memory(memory: pd.DataFrame) -> pd.Series:
    """Per memory row: reserved (else allocated, else the sum of the categories) bytes."""
    for col in ("reserved_bytes", "allocated_bytes"):
        if col in memory and memory[col].notna().any():
            return memory[col].astype(float)
    cats = [c for c, *_ in CATEGORIES if c in memory and c not in ("reserved_bytes",)]
    if not cats:
        return pd.Series(np.nan, index=memory.index)
    return memory[cats].astype(float).ffill().fillna(0).sum(axis=1)


def _full(v: RunView, table: str) -> pd.DataFrame:
    return lowest_rank(v.full.get(table, v.frame(table)))


def _line(fig: Fig, name: str, x: pd.Series, y: pd.Series, unit: str, scale: float = 1.0) -> None:
    ok = (x.notna() & y.notna()).to_numpy()
    xs, ys = x.to_numpy(dtype=float)[ok], y.to_numpy(dtype=float)[ok] / scale
    idx = downsample_indices(xs, ys, MAX_POINTS // 2)
    fig.add_trace({"type": "scatter", "mode": "lines", "name": plot_text(name), "x": xs[idx].tolist(),
                   "y": ys[idx].tolist(), "hovertemplate": hover_template(unit) if unit else None})


def compare_figures(views: list[tuple[str, RunView]]) -> tuple[Fig, Fig, Fig, Fig]:
    """(loss, throughput, memory, step time) with one line per run (rank 0), by step."""
    mems = [total_memory(_full(v, "memory")) for _, v in views]
    unit, scale = byte_unit(max((float(m.max()) for m in mems if len(m) and m.notna().any()), default=None))
    durs = [pd.to_numeric(_full(v, "steps")["duration_s"], errors="coerce") for _, v in views
            if "duration_s" in _full(v, "steps")]
    t_unit, t_scale = time_unit(float(pd.concat(durs).median()) if durs else None)
    loss = base_figure("Loss", height=320, yaxis_title="loss")
    rate = base_figure(f"Throughput (median of {WINDOW} steps)", height=320, yaxis_title="tokens/s")
    mem = base_figure("Memory (reserved, else allocated, else sum of categories)", height=320,
                      yaxis_title="memory", bytes_axis=unit)
    st = base_figure(f"Step time (median of {WINDOW})", height=320, yaxis_title="step time")
    st.update_layout(yaxis=unit_axis(t_unit))
    rate_col = "tokens" if any("tokens" in _full(v, "steps") and _full(v, "steps")["tokens"].notna().any()
                               for _, v in views) else "samples"
    rate.update_layout(yaxis={"title": {"text": f"{rate_col}/s"}})
    for (name, v), m in zip(views, mems, strict=True):
        mrows = _full(v, "memory")
        if len(mrows) and "step" in mrows:
            _line(mem, name, mrows["step"], m, unit, scale)
        s = _full(v, "steps")
        if not len(s) or "step" not in s:
            continue
        if "loss" in s:
            _line(loss, name, s["step"], pd.to_numeric(s["loss"], errors="coerce"), "")
        if "duration_s" in s:
            d = pd.to_numeric(s["duration_s"], errors="coerce")
            _line(st, name, s["step"], d.rolling(WINDOW, min_periods=1).median(), t_unit, t_scale)
            if rate_col in s:
                r = pd.to_numeric(s[rate_col], errors="coerce") / d.where(d > 0)
                _line(rate, name, s["step"], r.rolling(WINDOW, min_periods=1).median(), f"{rate_col}/s")
    return loss, rate, mem, st


def compare_rows(views: list[tuple[str, RunView]], facts: list[Any], baseline: int = 0) -> list[dict[str, Any]]:
    """One row per run: its facts (peaks by category, peak memory, median step time, tokens/s, loss spikes) and
    each one's ratio to the ``baseline``-th run's."""
    def head(f: Any, key: str) -> float:
        v = None if f is None else f.headline.get(key)
        return float(v) if v is not None else float("nan")

    base = facts[baseline] if 0 <= baseline < len(facts) else None
    b = {k: head(base, k) for k in ("peak_memory_bytes", "step_time_median_s", "tokens_per_s")}

    def rel(x: float, ref: float) -> str:
        return f"{x / ref:.2f}x" if np.isfinite(x) and np.isfinite(ref) and ref else "-"

    rows: list[dict[str, Any]] = []
    for i, ((name, _), f) in enumerate(zip(views, facts, strict=True)):
        row: dict[str, Any] = {"run": name + (" (baseline)" if i == baseline else "")}
        for label, key in _PEAK_KEYS.items():
            row[label] = human_bytes((f.peak_bytes or {}).get(key)) if f is not None else "-"
        peak, med, tps = (head(f, k) for k in ("peak_memory_bytes", "step_time_median_s", "tokens_per_s"))
        row.update({"peak memory": human_bytes(peak if np.isfinite(peak) else None),
                    "peak vs baseline": rel(peak, b["peak_memory_bytes"]),
                    "median step": fmt_s(med), "step time vs baseline": rel(med, b["step_time_median_s"]),
                    "tokens/s": fmt_rate(tps if np.isfinite(tps) else None),
                    "tokens/s vs baseline": rel(tps, b["tokens_per_s"]),
                    "MFU": fmt_mfu(None if f is None else f.headline.get("mfu")),
                    "loss spikes": "-" if f is None else str(len(f.loss_spike_steps))})
        rows.append(row)
    return rows


def compare_page(views: list[tuple[str, RunView]], missing: list[str], facts: list[Any] | None = None,
                 baseline: int = 0) -> html.Div:
    children: list[Any] = [html.H2("Compare runs"), dcc.Link("← all runs", href=href("/"))]
    if missing:
        children.append(note("not found: " + ", ".join(missing)))
    if len(views) < 2:
        children.append(note("pick two or more runs on the runs page to compare them"))
        return html.Div(children, id="compare-page")
    facts = facts if facts is not None else [None] * len(views)
    baseline = baseline if 0 <= baseline < len(views) else 0
    figs = compare_figures(views)
    rows = compare_rows(views, facts, baseline)
    children += [
        html.Div([html.Span("baseline ", className="muted"),
                  dcc.Dropdown(id="compare-baseline", options=[{"label": n, "value": i} for i, (n, _) in enumerate(views)],
                               value=baseline, clearable=False, style={"width": "320px"})],
                 style={"display": "flex", "gap": "8px", "alignItems": "center", "margin": "8px 0"}),
        dash_table.DataTable(  # type: ignore[attr-defined]
            id="compare-table", data=rows, columns=[{"name": c, "id": c} for c in rows[0]],
            style_cell={"textAlign": "left", "fontSize": 12}, style_table={"overflowX": "auto"}),
        html.Div([html.Div(dcc.Graph(id=g, figure=f, config=_CONFIG), className="half")
                  for g, f in zip(COMPARE_GRAPHS, figs, strict=True)], className="row"),
    ]
    return html.Div(children, id="compare-page")
