"""Events: a timeline and a table (OOMs, batch-size changes, precision fallbacks, collectors
unavailable, ...). Clicking one moves the replay cursor to its step."""

from __future__ import annotations

from typing import Any

import pandas as pd
from dash import dash_table
from gpudash.server.layouts.common import base_figure, plot_text, waiting_figure
from gpudash.server.layouts.fig import Fig

__all__ = ["KIND_COLORS", "event_rows", "event_step", "events_figure", "events_table", "neighbor_event"]

KIND_COLORS = {"oom": "#d62728", "batch_size": "#1f77b4", "batch_size_change": "#1f77b4",
               "precision_fallback": "#ff7f0e", "collector_unavailable": "#7f7f7f", "loss_spike": "#9467bd",
               "nan": "#e377c2", "checkpoint": "#2ca02c", "alert": "#b71c1c"}


def _step_of(ev: pd.DataFrame) -> pd.Series:
    return pd.to_numeric(ev["step"], errors="coerce") if "step" in ev else pd.Series(index=ev.index, dtype=float)


def events_figure(events: pd.DataFrame) -> Fig:
    fig = base_figure("Events", height=260, yaxis_title="")
    fig.update_layout(hovermode="closest", showlegend=False)
    if not len(events):
        return waiting_figure(fig, "no events recorded")
    steps = _step_of(events)
    for kind, g in events.groupby("kind", sort=True):
        s = steps.loc[g.index]
        fig.add_trace({
            "type": "scatter", "x": s.fillna(0).astype(float).tolist(), "y": [plot_text(kind)] * len(g),
            "mode": "markers", "name": plot_text(kind),
            "marker": {"size": 12, "color": KIND_COLORS.get(str(kind), "#17becf"), "symbol": "diamond"},
            "customdata": s.fillna(0).astype(int).tolist(),
            "hovertext": [plot_text(m, 200) for m in g["message"].fillna("")], "hoverinfo": "text+x"})
    return fig


def event_rows(events: pd.DataFrame, limit: int = 500) -> list[dict[str, Any]]:
    """Rows for the events table: plain strings and numbers (a DataTable shows them as text)."""
    if not len(events):
        return []
    ev = events.tail(limit)
    steps = _step_of(ev)
    t = pd.to_datetime(ev["time"], unit="s", errors="coerce") if "time" in ev else None
    rows = []
    for i, (_, row) in enumerate(ev.iterrows()):
        step = steps.iloc[i]
        rows.append({
            "time": t.iloc[i].strftime("%H:%M:%S") if t is not None and pd.notna(t.iloc[i]) else "",
            "step": int(step) if pd.notna(step) else None,
            "rank": int(row.get("rank", 0)),
            "kind": str(row.get("kind", "")),
            "message": str(row.get("message", "") or ""),
        })
    return rows


def events_table(rows: list[dict[str, Any]], table_id: str = "events-table") -> Any:
    return dash_table.DataTable(  # type: ignore[attr-defined]
        id=table_id, data=rows, page_size=12, sort_action="native", filter_action="native",
        columns=[{"name": c, "id": c} for c in ("time", "step", "rank", "kind", "message")],
        style_cell={"textAlign": "left", "fontSize": 12, "whiteSpace": "normal", "height": "auto",
                    "maxWidth": 600},
        style_table={"overflowX": "auto"},
    )


def event_step(click: dict[str, Any] | None = None, active_cell: dict[str, Any] | None = None,
               rows: list[dict[str, Any]] | None = None) -> int | None:
    """The step an event click points at: a timeline ``clickData`` or a table ``active_cell``."""
    if click and click.get("points"):
        p = click["points"][0]
        v = p.get("customdata", p.get("x"))
        try:
            return int(v)
        except (TypeError, ValueError):
            return None
    if active_cell and rows:
        row_id = active_cell.get("row")
        if isinstance(row_id, int) and 0 <= row_id < len(rows):
            step = rows[row_id].get("step")
            return int(step) if step is not None else None
    return None


def neighbor_event(event_steps: list[int], cursor: int, direction: int) -> int | None:
    """The first event step after (direction 1) or before (-1) ``cursor``."""
    steps = sorted(set(int(s) for s in event_steps))
    if direction > 0:
        return next((s for s in steps if s > cursor), None)
    return next((s for s in reversed(steps) if s < cursor), None)
