"""Compare runs: memory and step time overlaid, and a table of peak memory by category, median
step time and tokens/s relative to the first run (the strategy benchmark as a picture)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from dash import dash_table, dcc, html
from gpudash.layouts.common import base_figure, fmt_bytes, fmt_num, fmt_s, note, plot_text
from gpudash.layouts.data import RunView
from gpudash.layouts.fig import Fig
from gpudash.layouts.memory import CATEGORIES
from gpudash.layouts.series import WINDOW

__all__ = ["compare_figures", "compare_page", "compare_rows", "total_memory"]


_CONFIG: Any = {"displaylogo": False}


def total_memory(memory: pd.DataFrame) -> pd.Series:
    """Per memory row: reserved (else allocated, else the sum of the categories) bytes."""
    for col in ("reserved_bytes", "allocated_bytes"):
        if col in memory and memory[col].notna().any():
            return memory[col].astype(float)
    cats = [c for c, *_ in CATEGORIES if c in memory and c not in ("reserved_bytes",)]
    if not cats:
        return pd.Series(np.nan, index=memory.index)
    return memory[cats].astype(float).ffill().fillna(0).sum(axis=1)


def _rank0(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["rank"] == df["rank"].min()] if "rank" in df and len(df) else df


def compare_figures(views: list[tuple[str, RunView]]) -> tuple[Fig, Fig]:
    mem = base_figure("Memory (reserved, else allocated, else sum of categories)", height=340,
                      yaxis_title="bytes", bytes_axis=True)
    st = base_figure(f"Step time (median of {WINDOW})", height=340, yaxis_title="seconds")
    for name, v in views:
        m = _rank0(v.frame("memory"))
        if len(m):
            tot = total_memory(m)
            ok = tot.notna()
            mem.add_trace({"type": "scatter", "x": m["step"][ok].tolist(), "y": tot[ok].tolist(), "mode": "lines",
                           "name": plot_text(name)})
        s = _rank0(v.frame("steps"))
        if len(s) and "duration_s" in s:
            med = s["duration_s"].astype(float).rolling(WINDOW, min_periods=1).median()
            st.add_trace({"type": "scatter", "x": s["step"].tolist(), "y": med.tolist(), "mode": "lines",
                          "name": plot_text(name)})
    return mem, st


def compare_rows(views: list[tuple[str, RunView]]) -> list[dict[str, Any]]:
    """One row per run: peaks by category, median step time, tokens/s, and ratios to the first run."""
    rows: list[dict[str, Any]] = []
    base: dict[str, float] = {}
    for i, (name, v) in enumerate(views):
        m, s = _rank0(v.frame("memory")), _rank0(v.frame("steps"))
        row: dict[str, Any] = {"run": name}
        for col, label, _, fn in CATEGORIES:
            if fn == "cache":
                continue
            row[label] = fmt_bytes(float(m[col].max())) if col in m and m[col].notna().any() else "-"
        peak = float(total_memory(m).max()) if len(m) else float("nan")
        med = float(s["duration_s"].median()) if len(s) and "duration_s" in s else float("nan")
        span = float(s["time"].max() - s["time"].min()) if len(s) > 1 else 0.0
        tps = float(s["tokens"].sum()) / span if span > 0 and "tokens" in s else float("nan")
        if i == 0:
            base = {"peak": peak, "med": med, "tps": tps}

        def rel(x: float, b: float) -> str:
            return f"{x / b:.2f}x" if np.isfinite(x) and np.isfinite(b) and b else "-"

        row.update({"peak memory": fmt_bytes(peak if np.isfinite(peak) else None), "peak vs first": rel(peak, base["peak"]),
                    "median step": fmt_s(med), "step vs first": rel(med, base["med"]),
                    "tokens/s": fmt_num(tps), "tokens/s vs first": rel(tps, base["tps"])})
        rows.append(row)
    return rows


def compare_page(views: list[tuple[str, RunView]], missing: list[str]) -> html.Div:
    children: list[Any] = [html.H2("Compare runs"), dcc.Link("← all runs", href="/")]
    if missing:
        children.append(note("not found: " + ", ".join(missing)))
    if len(views) < 2:
        children.append(note("pick two or more runs on the runs page to compare them"))
        return html.Div(children, id="compare-page")
    mem, st = compare_figures(views)
    rows = compare_rows(views)
    children += [
        dcc.Graph(id="compare-memory", figure=mem, config=_CONFIG),
        dcc.Graph(id="compare-step-time", figure=st, config=_CONFIG),
        dash_table.DataTable(  # type: ignore[attr-defined]
            id="compare-table", data=rows, columns=[{"name": c, "id": c} for c in rows[0]],
                             style_cell={"textAlign": "left", "fontSize": 12}),
    ]
    return html.Div(children, id="compare-page")
