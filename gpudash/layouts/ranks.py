"""The ranks view of a torchrun run: ranks side by side, step time per rank, a straggler indicator.

Pure builders over the ``steps`` and ``memory`` frames of a view (any number of
rows per rank; the run page passes its downsampled frames). The numbers come
from :mod:`gpudash.analysis.ranks`; this module only formats and draws them.
A run with one rank has no ranks view: :func:`ranks_children` returns ``[]``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
from dash import dash_table, dcc, html
from gpudash.analysis.ranks import (
    STRAGGLER_RATIO,
    WAIT_PHASE,
    node_stragglers,
    rank_nodes,
    rank_skew,
    rank_summary,
    rank_work,
    straggler_summary,
)
from gpudash.layouts.common import base_figure, fmt_bytes, fmt_num, fmt_s, note, plot_text
from gpudash.layouts.fig import Fig
from gpudash.layouts.stability import Light, lights_row
from gpudash.layouts.throughput import phase_columns

__all__ = ["HEATMAP_RANKS", "node_rows", "rank_count", "rank_heatmap_figure", "rank_nodes", "rank_rows",
           "rank_step_figure", "ranks_box", "ranks_children", "ranks_table", "straggler_lights", "straggler_list"]

#: Above this many ranks, one line per rank is unreadable: step time is drawn as a rank × step heat map.
HEATMAP_RANKS = 8
#: Columns of the heat map at most (steps are binned to fit; each cell is the bin's median).
HEATMAP_STEPS = 300
#: Stragglers listed by name at most (the rest are counted).
TOP_STRAGGLERS = 8

#: Skew (slowest / median - 1, or a phase's spread over the median step) below GREEN is noise, above RED acts.
GREEN, RED = 0.05, 0.20


def rank_count(steps: pd.DataFrame) -> int:
    return int(steps["rank"].nunique()) if len(steps) and "rank" in steps else 0


def _rate(g: pd.DataFrame, col: str) -> float | None:
    if col not in g or "duration_s" not in g:
        return None
    both = g[[col, "duration_s"]].apply(pd.to_numeric, errors="coerce").dropna()
    total = float(both["duration_s"].sum())
    return float(both[col].sum()) / total if total > 0 and len(both) else None


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) else None


def _several_nodes(nodes: dict[int, str] | None) -> bool:
    return bool(nodes) and len(set(nodes.values())) > 1  # type: ignore[union-attr]


def _order(ranks_: Any, nodes: dict[int, str] | None) -> list[int]:
    """Ranks grouped by node (nodes in name order), by rank within a node."""
    nodes = nodes or {}
    return sorted((int(r) for r in ranks_), key=lambda r: (nodes.get(r, "?"), r))


def rank_rows(steps: pd.DataFrame, memory: pd.DataFrame,
              nodes: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """One row of text per rank: steps, median / p95 step time, phases, samples/s, tokens/s, peak memory and
    how often the rank was the slowest (a column no rank recorded is left out). With ranks on several
    ``nodes`` (rank -> node name) the rows are grouped by node and carry a ``node`` column."""
    summary = rank_summary(SimpleNamespace(steps=steps, memory=memory))
    phases = [c.removesuffix("_s") for c in phase_columns(steps)] if len(steps) else []
    rows: list[dict[str, Any]] = []
    several = _several_nodes(nodes)
    for rank in _order(summary.index, nodes) if several else summary.index.astype(int):
        r = summary.loc[rank]
        g = steps[steps["rank"] == rank]
        row: dict[str, Any] = {"node": (nodes or {}).get(int(rank), "?")} if several else {}
        row |= {"rank": int(rank), "steps": int(r["steps"]),
                               "step_median": fmt_s(_num(r.get("step_median_s"))),
                               "step_p95": fmt_s(_num(r.get("step_p95_s")))}
        for ph in phases:
            row[f"{ph}_median"] = fmt_s(_num(r.get(f"{ph}_median_s")))
        row["samples_s"] = fmt_num(_rate(g, "samples"))
        row["tokens_s"] = fmt_num(_rate(g, "tokens"))
        row["memory_peak"] = fmt_bytes(_num(r.get("memory_peak_bytes")))
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


def _color(value: float | None) -> str:
    if value is None:
        return "grey"
    return "green" if value < GREEN else "amber" if value < RED else "red"


def _phase_spreads(skew: pd.DataFrame, phases: list[str]) -> dict[str, tuple[float, int | None, float]]:
    """Per phase: median spread across ranks (s), the rank most often slowest in it and how often."""
    out: dict[str, tuple[float, int | None, float]] = {}
    for ph in phases:
        col = f"{ph}_skew_s"
        if col not in skew or not skew[col].notna().any():
            continue
        slow = skew[f"{ph}_slowest_rank"].dropna() if f"{ph}_slowest_rank" in skew else pd.Series(dtype=float)
        counts = slow.value_counts()
        out[ph] = (float(skew[col].median()), int(counts.index[0]) if len(counts) else None,
                   float(counts.iloc[0] / len(skew)) if len(counts) else 0.0)
    return out


def _cause_phase(spreads: dict[str, tuple[float, int | None, float]]) -> str | None:
    """The phase that explains the skew. Under DDP the fast ranks wait for the straggler inside ``backward``
    (the gradient all-reduce), so backward's spread is the symptom: another phase with at least half of its
    spread is the cause."""
    if not spreads:
        return None
    others = {ph: v for ph, v in spreads.items() if ph != WAIT_PHASE}
    best = max(others, key=lambda ph: others[ph][0]) if others else None
    wait = spreads.get(WAIT_PHASE)
    if best is None or (wait is not None and wait[0] > 2 * others[best][0]):
        return WAIT_PHASE if wait is not None else best
    return best


def straggler_lights(steps: pd.DataFrame, memory: pd.DataFrame, nodes: dict[int, str] | None = None) -> list[Light]:
    """Traffic lights: step-time skew (and the slowest rank), the phase that differs most across ranks (under
    DDP the fast ranks wait inside backward, so the cause shows here), and memory imbalance; with ranks on
    several ``nodes``, a node light (a node whose ranks are all slow is one node straggler)."""
    skew = rank_skew(SimpleNamespace(steps=steps, memory=memory))
    if skew.empty:
        return [("straggler", "grey", "no step recorded by two ranks yet")]
    s = straggler_summary(skew)
    lights: list[Light] = []
    ratio = s.get("skew_ratio_median")
    p95 = s.get("skew_ratio_p95")
    detail = (f"slowest rank {s['slowest_rank']} ({100 * s['slowest_rank_share']:.0f} % of steps); "
              f"slowest step over the median step: {fmt_num(None if ratio is None else 100 * ratio, 2)} % "
              f"(median), {fmt_num(None if p95 is None else 100 * p95, 2)} % (p95); "
              f"{100 * s['slow_steps_share']:.0f} % of {s['steps']} steps over 10 %")
    lights.append(("step-time skew", _color(ratio), detail))
    spreads = _phase_spreads(skew, [c.removesuffix("_s") for c in phase_columns(steps)])
    cause = _cause_phase(spreads)
    median_step = float(skew["duration_median_s"].median())
    if cause is None:
        lights.append(("slowest phase", "grey", "no phases recorded (monitor.phase(...))"))
    else:
        spread, rank, share = spreads[cause]
        rel = spread / median_step if median_step > 0 else None
        who = "" if rank is None else f"rank {rank} slowest in {100 * share:.0f} % of steps; "
        detail = f"{cause}: {who}spread {fmt_s(spread)} ({fmt_num(None if rel is None else 100 * rel, 2)} % of a step)"
        wait = spreads.get(WAIT_PHASE)
        if cause != WAIT_PHASE and wait is not None and wait[1] is not None and wait[1] != rank:
            detail += f"; rank {wait[1]} waits for it in {WAIT_PHASE}"
        lights.append(("slowest phase", _color(rel), detail))
    imb = s.get("memory_imbalance_max")
    if imb is None:
        lights.append(("memory imbalance", "grey", "memory not recorded"))
    elif float(imb) < 0.005:
        lights.append(("memory imbalance", "green", "ranks within 0.5 % of the mean"))
    else:
        lights.append(("memory imbalance", _color(float(imb)),
                       f"heaviest rank {s['heaviest_rank']}: {100 * float(imb):.1f} % over the mean at step "
                       f"{s['memory_imbalance_step']}"))
    verdict = _verdict(lights, s, cause, spreads)
    if _several_nodes(nodes):
        node_light = _node_light(node_stragglers(SimpleNamespace(steps=steps, memory=memory), nodes))
        lights.append(node_light)
        if node_light[2].startswith("node ") and node_light[1] in ("amber", "red"):
            order = ("grey", "green", "amber", "red")
            color = max(verdict[1], node_light[1], key=order.index)
            verdict = ("straggler", color, node_light[2].split(";")[0])
    return [verdict, *lights]


def _late(excess: float) -> str:
    return f"{100 * excess:.0f} % of a step late"


def _node_light(st: dict[str, Any]) -> Light:
    """The node light: the slow node(s) named once, else the slow ranks on healthy nodes, else green."""
    if not st["steps"]:
        return ("node straggler", "grey", "no step recorded by two ranks yet")
    by_node: pd.DataFrame = st["nodes"]
    if st["node_stragglers"]:
        worst = st["node_stragglers"][0]
        excess = float(by_node.loc[worst, "excess_median"])
        more = f"; {len(st['node_stragglers']) - 1} more slow node(s)" if len(st["node_stragglers"]) > 1 else ""
        return ("node straggler", _color(excess),
                f"node {worst} (all {int(by_node.loc[worst, 'ranks'])} ranks, {_late(excess)}){more}")
    if st["rank_stragglers"]:
        return ("node straggler", "green",
                f"no node is slow as a whole; {len(st['rank_stragglers'])} slow rank(s) on healthy nodes")
    return ("node straggler", "green", f"{len(by_node)} nodes within {100 * STRAGGLER_RATIO:.0f} % of a step")





def _verdict(lights: list[Light], s: dict[str, Any], cause: str | None,
             spreads: dict[str, tuple[float, int | None, float]]) -> Light:
    """The headline light: which rank straggles and where, from the step-time and phase lights."""
    order = ("grey", "green", "amber", "red")
    step_color, phase_color = lights[0][1], lights[1][1]
    color = max(step_color, phase_color, key=order.index)
    if color in ("green", "grey"):
        return ("straggler", color, "none: ranks within 5 % of each other" if color == "green" else "not known")
    if phase_color == color and cause is not None and spreads[cause][1] is not None:
        return ("straggler", color, f"rank {spreads[cause][1]} (slow in {cause})")
    return ("straggler", color, f"rank {s['slowest_rank']} (slowest step in {100 * s['slowest_rank_share']:.0f} % "
                                "of steps)")


def node_rows(st: dict[str, Any]) -> list[dict[str, Any]]:
    """One row of text per node from :func:`gpudash.analysis.ranks.node_stragglers`: its ranks, how many
    are slow, the median lateness and whether the node as a whole straggles."""
    ranks_: pd.DataFrame = st["ranks"]
    rows = []
    for node, r in st["nodes"].iterrows():
        members = sorted(int(x) for x in ranks_.index[ranks_["node"] == node])
        rows.append({"node": str(node), "ranks": _spans(members), "slow_ranks": int(r["slow_ranks"]),
                     "late": _late(float(r["excess_median"])) if np.isfinite(r["excess_median"]) else "-",
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
                     f"{_late(float(st['nodes'].loc[n, 'excess_median']))}")
    lines += [f"rank {r} on {ranks_.loc[r, 'node']}: {_late(float(ranks_.loc[r, 'excess']))}"
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
    several = _several_nodes(nodes)
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


def ranks_children(steps: pd.DataFrame, memory: pd.DataFrame, nodes: dict[int, str] | None = None) -> list[Any]:
    """The ranks section's contents, or ``[]`` for a run with fewer than two ranks. ``nodes`` (rank -> node
    name, :func:`gpudash.analysis.ranks.rank_nodes`) groups the ranks by machine. Above
    :data:`HEATMAP_RANKS` ranks step time is a heat map and the top stragglers are listed by name."""
    n = rank_count(steps)
    if n < 2:
        return []
    rows = rank_rows(steps, memory, nodes)
    out: list[Any] = [html.Div(lights_row(straggler_lights(steps, memory, nodes)), id="straggler-lights",
                               className="lights")]
    st = node_stragglers(SimpleNamespace(steps=steps, memory=memory), nodes or {})
    if _several_nodes(nodes) and len(st["nodes"]):
        out.append(html.Div(dash_table.DataTable(  # type: ignore[attr-defined]
            id="nodes-table", data=node_rows(st), sort_action="native",
            columns=[{"name": h, "id": k} for k, h in (("node", "node"), ("ranks", "ranks"),
                                                       ("slow_ranks", "slow ranks"), ("late", "median lateness"),
                                                       ("straggler", "straggler"))],
            style_cell={"textAlign": "right", "fontSize": 13, "padding": "3px 8px"},
            style_header={"fontWeight": "600"}), className="ranks-table"))
    if n > HEATMAP_RANKS or _several_nodes(nodes):
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


def ranks_box(steps: pd.DataFrame, memory: pd.DataFrame, nodes: dict[int, str] | None = None) -> list[Any]:
    """Children of the page's ``ranks-box``: the "Ranks" section, or nothing for a single-rank run."""
    children = ranks_children(steps, memory, nodes)
    if not children:
        return []
    return [html.Section([html.H3("Ranks"), *children], id="ranks-view", className="view")]
