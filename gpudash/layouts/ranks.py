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
from gpudash.analysis.ranks import rank_skew, rank_summary, straggler_summary
from gpudash.layouts.common import base_figure, fmt_bytes, fmt_num, fmt_s, note
from gpudash.layouts.fig import Fig
from gpudash.layouts.stability import Light, lights_row
from gpudash.layouts.throughput import phase_columns

__all__ = ["rank_count", "rank_rows", "rank_step_figure", "ranks_box", "ranks_children", "ranks_table",
           "straggler_lights"]

#: Skew (slowest / median - 1, or a phase's spread over the median step) below GREEN is noise, above RED acts.
GREEN, RED = 0.05, 0.20
#: Where data-parallel ranks wait for each other (DDP all-reduces gradients during backward).
WAIT_PHASE = "backward"


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


def rank_rows(steps: pd.DataFrame, memory: pd.DataFrame) -> list[dict[str, Any]]:
    """One row of text per rank: steps, median / p95 step time, phases, samples/s, tokens/s, peak memory and
    how often the rank was the slowest (a column no rank recorded is left out)."""
    summary = rank_summary(SimpleNamespace(steps=steps, memory=memory))
    phases = [c.removesuffix("_s") for c in phase_columns(steps)] if len(steps) else []
    rows: list[dict[str, Any]] = []
    for rank in summary.index.astype(int):
        r = summary.loc[rank]
        g = steps[steps["rank"] == rank]
        row: dict[str, Any] = {"rank": int(rank), "steps": int(r["steps"]),
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
    empty = [k for k in (rows[0] if rows else {}) if k not in ("rank", "steps") and all(r[k] == "-" for r in rows)]
    return [{k: v for k, v in r.items() if k not in empty} for r in rows]  # columns no rank recorded


_HEADERS = {"rank": "rank", "steps": "steps", "step_median": "step median", "step_p95": "step p95",
            "samples_s": "samples/s", "tokens_s": "tokens/s", "memory_peak": "peak memory",
            "slowest_share": "slowest in"}


def ranks_table(rows: list[dict[str, Any]]) -> Any:
    keys = list(rows[0]) if rows else list(_HEADERS)
    cols = [{"name": _HEADERS.get(k, k.removesuffix("_median") + " median"), "id": k} for k in keys]
    return dash_table.DataTable(  # type: ignore[attr-defined]
        id="ranks-table", data=rows, columns=cols, sort_action="native",
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


def straggler_lights(steps: pd.DataFrame, memory: pd.DataFrame) -> list[Light]:
    """Traffic lights: step-time skew (and the slowest rank), the phase that differs most across ranks (under
    DDP the fast ranks wait inside backward, so the cause shows here), and memory imbalance."""
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
    return [_verdict(lights, s, cause, spreads), *lights]


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


def ranks_children(steps: pd.DataFrame, memory: pd.DataFrame) -> list[Any]:
    """The ranks section's contents, or ``[]`` for a run with fewer than two ranks."""
    if rank_count(steps) < 2:
        return []
    rows = rank_rows(steps, memory)
    return [
        html.Div(lights_row(straggler_lights(steps, memory)), id="straggler-lights", className="lights"),
        html.Div(ranks_table(rows), className="ranks-table") if rows else note("no steps recorded"),
        dcc.Graph(id="rank-step-graph", figure=rank_step_figure(steps), config={"displaylogo": False},
                  className="graph"),
    ]


def ranks_box(steps: pd.DataFrame, memory: pd.DataFrame) -> list[Any]:
    """Children of the page's ``ranks-box``: the "Ranks" section, or nothing for a single-rank run."""
    children = ranks_children(steps, memory)
    if not children:
        return []
    return [html.Section([html.H3("Ranks"), *children], id="ranks-view", className="view")]
