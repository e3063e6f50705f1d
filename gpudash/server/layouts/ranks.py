"""The ranks view of a torchrun run: ranks side by side, step time per rank, a straggler indicator.

Pure builders over the ``steps`` and ``memory`` frames of a view. The numbers
(table, lights, stragglers) come from :mod:`gpudash.analysis.ranks` over every
row (the view's full frames); the charts are drawn from the downsampled ones.
This module only formats and draws them.
A run with one rank has no ranks view: :func:`ranks_children` returns ``[]``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
from dash import dash_table, dcc, html
from gpudash.analysis.phases import phase_columns
from gpudash.analysis.rank_lights import late_text, several_nodes, straggler_lights
from gpudash.analysis.ranks import (
    STRAGGLER_RATIO,
    node_stragglers,
    rank_nodes,
    rank_summary,
    rank_work,
)
from gpudash.server.layouts.common import base_figure, fmt_s, note, plot_text
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.stability import lights_row
from gpudash.units import fmt_num, human_bytes

__all__ = ["HEATMAP_RANKS", "node_rows", "rank_count", "rank_heatmap_figure", "rank_nodes", "rank_rows",
           "rank_step_figure", "ranks_box", "ranks_children", "ranks_table", "straggler_lights", "straggler_list"]

#: Above this many ranks, one line per rank is unreadable: step time is drawn as a rank × step heat map.
HEATMAP_RANKS = 8
#: Columns of the heat map at most (steps are binned to fit; each cell is the bin's median).
HEATMAP_STEPS = 300
#: Stragglers listed by name at most (the rest are counted).
TOP_STRAGGLERS = 8



def rank_count(steps: pd.DataFrame) -> int:
    return int(steps["rank"].nunique()) if len(steps) and "rank" in steps else 0


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) else None


def _order(ranks_: Any, nodes: dict[int, str] | None) -> list[int]:
    """Ranks grouped by node (nodes in name order), by rank within a node."""
    nodes = nodes or {}
    return sorted((int(r) for r in ranks_), key=lambda r: (nodes.get(r, "?"), r))


def rank_rows(steps: pd.DataFrame, memory: pd.DataFrame,
              nodes: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """One row of text per rank: steps, median / p95 step time, phases, samples/s, tokens/s, peak memory and
    how often the rank was the slowest (a column no rank recorded is left out), from every row given
    (:func:`gpudash.analysis.ranks.rank_summary`). With ranks on several ``nodes`` (rank -> node name) the
    rows are grouped by node and carry a ``node`` column."""
    summary = rank_summary(SimpleNamespace(steps=steps, memory=memory))
    phases = [c.removesuffix("_s") for c in phase_columns(steps)] if len(steps) else []
    rows: list[dict[str, Any]] = []
    several = several_nodes(nodes)
    for rank in _order(summary.index, nodes) if several else summary.index.astype(int):
        r = summary.loc[rank]
        row: dict[str, Any] = {"node": (nodes or {}).get(int(rank), "?")} if several else {}
        row |= {"rank": int(rank), "steps": int(r["steps"]),
                               "step_median": fmt_s(_num(r.get("step_median_s"))),
                               "step_p95": fmt_s(_num(r.get("step_p95_s")))}
        for ph in phases:
            row[f"{ph}_median"] = fmt_s(_num(r.get(f"{ph}_median_s")))
        row["samples_s"] = fmt_num(_num(r.get("samples_per_s")))
        row["tokens_s"] = fmt_num(_num(r.get("tokens_per_s")))
        row["memory_peak"] = human_bytes(_num(r.get("memory_peak_bytes")))
        share = _num(r.get("slowest_share"))
        row["slowest_share"] = "-" if share is None else f"{100 * share:.0f} %"
        rows.append(row)
    empty = [k for k in (rows[0] if rows else {})
             if k not in ("node", "rank", "steps") and all(r[k] == "-" for r in rows)]
    return [{k: v for k, v in r.items() if k not in empty} for r in rows]  # columns no rank recorded


_HEADERS = {"node": "node", "rank": "rank", "steps": "steps", "step_median": "step median", "step_p95": "step p95",
            "samples_s": "samples/s", "tokens_s": "tokens/s", "memory_peak": "peak memory",
            "slowest_share": "slowest in"}


def ranks_table(rows: list[dict[str, Any]]) -> Any:
    keys = list(rows[0]) if rows else list(_HEADERS)
    cols = [{"name": _HEADERS.get(k, k.removesuffix("_median") + " median"), "id": k} for k in keys]
    return dash_table.DataTable(  # type: ignore[attr-defined]
        id="ranks-table", data=rows, columns=cols, sort_action="native", filter_action="native", page_size=16,
        style_cell={"textAlign": "right", "fontSize": 13, "padding": "3px 8px"},
        style_header={"fontWeight": "600"},
    )


def rank_step_figure(steps: pd.DataFrame) -> Fig:
    """Step time over steps, one trace per rank (the frame is already downsampled per rank)."""
    fig = base_figure("Step time per rank", yaxis_title="seconds")
    if not len(steps) or "duration_s" not in steps:
        return fig
    for rank, g in steps.dropna(subset=["step", "duration_s"]).groupby("rank", sort=True):
        g = g.sort_values("step")
        fig.add_trace({"type": "scatter", "x": g["step"].astype("int64").tolist(),
                       "y": g["duration_s"].astype(float).tolist(), "name": f"rank {int(rank)}",
                       "mode": "lines" if len(g) > 2 else "lines+markers", "line": {"width": 1.2}})
    return fig


def node_rows(st: dict[str, Any]) -> list[dict[str, Any]]:
    """One row of text per node from :func:`gpudash.analysis.ranks.node_stragglers`: its ranks, how many
    are slow, the median lateness and whether the node as a whole straggles."""
    ranks_: pd.DataFrame = st["ranks"]
    rows = []
    for node, r in st["nodes"].iterrows():
        members = sorted(int(x) for x in ranks_.index[ranks_["node"] == node])
        rows.append({"node": str(node), "ranks": _spans(members), "slow_ranks": int(r["slow_ranks"]),
                     "late": late_text(float(r["excess_median"])) if np.isfinite(r["excess_median"]) else "-",
                     "straggler": "whole node" if r["straggler"] else ("some ranks" if r["slow_ranks"] else "-")})
    return rows


def _spans(ranks_: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0–2, 5``."""
    spans: list[list[int]] = []
    for r in ranks_:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


def straggler_list(st: dict[str, Any], limit: int = TOP_STRAGGLERS) -> list[str]:
    """The top stragglers as lines of text, worst first: slow nodes (named once), then slow ranks."""
    ranks_: pd.DataFrame = st["ranks"]
    lines = []
    for n in st["node_stragglers"]:
        members = _spans(sorted(int(r) for r in ranks_.index[ranks_["node"] == n]))
        lines.append(f"node {n}: all {int(st['nodes'].loc[n, 'ranks'])} ranks ({members}), "
                     f"{late_text(float(st['nodes'].loc[n, 'excess_median']))}")
    lines += [f"rank {r} on {ranks_.loc[r, 'node']}: {late_text(float(ranks_.loc[r, 'excess']))}"
              for r in st["rank_stragglers"]]
    if len(lines) > limit:
        lines = [*lines[:limit], f"and {len(lines) - limit} more"]
    return lines


def rank_heatmap_figure(steps: pd.DataFrame, nodes: dict[int, str] | None = None) -> Fig:
    """Each rank's own work per step as a heat map, ranks (grouped by node) down, steps across: readable at
    hundreds of ranks. Under DDP the fast ranks wait for the slow one in backward, so the time outside
    backward is drawn when phases were recorded; else the step time."""
    work = rank_work(SimpleNamespace(steps=steps))
    measure = str(work.attrs.get("measure", "step time")) if not work.empty else "step time"
    fig = base_figure(f"{measure.capitalize()} per rank (s)", height=300, yaxis_title="rank")
    if work.empty:
        return fig
    if len(work) > HEATMAP_STEPS:
        width = -(-len(work) // HEATMAP_STEPS)
        work = work.groupby((work.index - work.index[0]) // width * width + work.index[0]).median()
    order = _order(work.columns, nodes)
    work = work[order]
    several = several_nodes(nodes)
    labels = [f"{plot_text((nodes or {}).get(r, '?'), 40)} · {r}" if several else f"rank {r}" for r in order]
    z = [[None if not np.isfinite(v) else float(v) for v in work[r].to_numpy(dtype=float)] for r in order]
    fig.add_trace({"type": "heatmap", "x": work.index.astype("int64").tolist(), "y": labels, "z": z,
                   "colorscale": "Viridis", "colorbar": {"title": {"text": "s"}},
                   "hovertemplate": "%{y}<br>step %{x}<br>%{z:.3s} s<extra></extra>"})
    if several:  # a line between nodes
        for i in range(1, len(order)):
            if nodes.get(order[i]) != nodes.get(order[i - 1]):  # type: ignore[union-attr]
                fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i - 0.5,
                              line={"color": "white", "width": 2})
    fig.update_layout(height=int(min(900, 120 + 8 * len(order))), hovermode="closest")
    fig.update_yaxes(autorange="reversed", type="category", showticklabels=len(order) <= 64)
    return fig


def ranks_children(steps: pd.DataFrame, memory: pd.DataFrame, nodes: dict[int, str] | None = None,
                   full: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> list[Any]:
    """The ranks section's contents, or ``[]`` for a run with fewer than two ranks. ``nodes`` (rank -> node
    name, :func:`gpudash.analysis.ranks.rank_nodes`) groups the ranks by machine. Above
    :data:`HEATMAP_RANKS` ranks step time is a heat map and the top stragglers are listed by name. ``full``:
    the steps and memory at full resolution when ``steps``/``memory`` are downsampled for the charts (the
    numbers are taken over every row)."""
    n = rank_count(steps)
    if n < 2:
        return []
    # every number over every row (the step x rank comparisons are numpy matrices: tens of milliseconds for
    # 64 ranks x 2,000 steps); a downsampled frame keeps a different slowest rank and misses stragglers
    all_steps, all_memory = full if full is not None else (steps, memory)
    rows = rank_rows(all_steps, all_memory, nodes)
    out: list[Any] = [html.Div(lights_row(straggler_lights(all_steps, all_memory, nodes)), id="straggler-lights",
                               className="lights")]
    st = node_stragglers(SimpleNamespace(steps=all_steps, memory=all_memory), nodes or {})
    if several_nodes(nodes) and len(st["nodes"]):
        out.append(html.Div(dash_table.DataTable(  # type: ignore[attr-defined]
            id="nodes-table", data=node_rows(st), sort_action="native",
            columns=[{"name": h, "id": k} for k, h in (("node", "node"), ("ranks", "ranks"),
                                                       ("slow_ranks", "slow ranks"), ("late", "median lateness"),
                                                       ("straggler", "straggler"))],
            style_cell={"textAlign": "right", "fontSize": 13, "padding": "3px 8px"},
            style_header={"fontWeight": "600"}), className="ranks-table"))
    if n > HEATMAP_RANKS or several_nodes(nodes):
        lines = straggler_list(st)
        out.append(html.Div([html.Strong("Top stragglers"), html.Ul([html.Li(t) for t in lines])] if lines
                            else note("no straggler: every rank within "
                                      f"{100 * STRAGGLER_RATIO:.0f} % of a step of the fast ranks"),
                            id="top-stragglers"))
    out.append(html.Div(ranks_table(rows), className="ranks-table") if rows else note("no steps recorded"))
    if n > HEATMAP_RANKS:
        out.append(dcc.Graph(id="rank-heatmap", figure=rank_heatmap_figure(steps, nodes),
                             config={"displaylogo": False}, className="graph"))
    else:
        out.append(dcc.Graph(id="rank-step-graph", figure=rank_step_figure(steps), config={"displaylogo": False},
                             className="graph"))
    return out


def ranks_box(steps: pd.DataFrame, memory: pd.DataFrame, nodes: dict[int, str] | None = None,
              full: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> list[Any]:
    """Children of the page's ``ranks-box``: the "Ranks" section, or nothing for a single-rank run (``full``:
    as :func:`ranks_children`)."""
    children = ranks_children(steps, memory, nodes, full)
    if not children:
        return []
    return [html.Section([html.H3("Ranks"), *children], id="ranks-view", className="view")]
