"""The live tick: new records since the cursor, as ``extendData`` payloads for each live graph.

Pure of Dash: the app's interval callback calls :func:`tick_view` with the
client-side state (a plain dict kept in a ``dcc.Store``) and gets back what to
append to each graph, the graphs rebuilt whole (a new column, rank or GPU
appeared, a trace grew past the point budget, or a chart was first drawn after
the page), the throughput lines, the events and the new state. :func:`live_tick`
is its store-reading half.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from gpudash.server.layouts import events, run_page, throughput
from gpudash.server.layouts.data import LIVE_TABLES, RunView, load_view, order_key
from gpudash.server.layouts.downsample import MAX_POINTS
from gpudash.server.layouts.fig import wire
from gpudash.server.layouts.series import WINDOW, Series, series_xy
from gpudash.server.layouts.xaxis import x_of
from gpudash.store.reader import RunReader

__all__ = ["LiveResult", "TickView", "initial_state", "live_tick", "tails_of", "tick_view"]

#: A live trace may grow to this many points by appending; then the graph is rebuilt downsampled.
LIVE_POINTS = 3 * MAX_POINTS
_TAIL_COLS = ("duration_s", "loss", "step")


def tails_of(frames: dict[str, pd.DataFrame]) -> dict[str, dict[str, list[float]]]:
    """The last ``WINDOW`` values per rank of the columns windowed series need (rolling median, spikes)."""
    out: dict[str, dict[str, list[float]]] = {}
    steps = frames.get("steps")
    if steps is None or not len(steps):
        return out
    for rank, g in steps.groupby("rank"):
        tail = g.tail(WINDOW)
        out[f"{rank}/steps"] = {c: [float(v) for v in tail[c]] for c in _TAIL_COLS if c in tail}
    return out


def initial_state(run_id: str, view: RunView, specs: dict[str, list[Series]], rank: int) -> dict[str, Any]:
    return {
        "run": run_id,
        "rank": rank,
        "cursor": dict(view.cursor),
        "last": dict(view.last),
        "tails": tails_of(view.frames),
        "specs": {g: [s.as_dict() for s in ss] for g, ss in specs.items()},
        "points": {g: max((len(series_xy(s, view.frame(s.table), view.t0)[0]) for s in ss), default=0)
                   for g, ss in specs.items()},
        "last_step": view.last_step,
        "status": view.status,
        "t0": view.t0,
        "events": int(len(view.frame("events"))),
    }


@dataclass
class LiveResult:
    state: dict[str, Any]
    extends: dict[str, Any] = field(default_factory=dict)
    rebuild: set[str] = field(default_factory=set)
    new_events: bool = False
    new_activations: bool = False
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)


def _dedupe(frames: dict[str, pd.DataFrame], last: dict[str, float]) -> dict[str, pd.DataFrame]:
    """Drop rows the page already drew (read by both the first load and this tick)."""
    out = {}
    for table, df in frames.items():
        key = order_key(table)
        if key not in df or "rank" not in df:
            out[table] = df
            continue
        ranks = df["rank"].to_numpy()
        marks = np.array([last.get(f"{r}/{table}", -np.inf) for r in ranks], dtype=float)
        vals = pd.to_numeric(df[key], errors="coerce").to_numpy(dtype=float)
        keep = ~(vals <= marks)  # NaN keys are kept
        if keep.all():
            out[table] = df
        elif keep.any():
            out[table] = df[keep].reset_index(drop=True)
    return out


def _advance(last: dict[str, float], table: str, df: pd.DataFrame) -> None:
    key = order_key(table)
    if key not in df or "rank" not in df:
        return
    vals = pd.to_numeric(df[key], errors="coerce").to_numpy(dtype=float)
    for r in np.unique(df["rank"].to_numpy()):
        v = vals[df["rank"].to_numpy() == r]
        if np.isfinite(v).any():
            k = f"{r}/{table}"
            last[k] = max(float(np.nanmax(v)), last.get(k, float("-inf")))


def _redone(frames: dict[str, pd.DataFrame], last: dict[str, float]) -> bool:
    """Whether a later attempt of a resumed run recorded steps the page drew already (they supersede those)."""
    df = frames.get("steps")
    if df is None or not len(df) or "attempt" not in df or "rank" not in df or "step" not in df:
        return False
    later = pd.to_numeric(df["attempt"], errors="coerce").to_numpy(dtype=float) > 1
    marks = np.array([last.get(f"{r}/steps", -np.inf) for r in df["rank"].to_numpy()], dtype=float)
    return bool((later & (pd.to_numeric(df["step"], errors="coerce").to_numpy(dtype=float) <= marks)).any())


def live_tick(reader: RunReader, state: dict[str, Any], spec_fn: Any) -> LiveResult:
    """Read what arrived since ``state['cursor']`` and turn it into extends.

    ``spec_fn(graph, frames) -> list[Series]`` names the series each graph would
    have for these rows; a series the graph does not have yet triggers a rebuild.
    """
    state = dict(state)
    raw, cursor = reader.read_since(state.get("cursor") or {}, tables=LIVE_TABLES, limit=LIVE_POINTS)
    state["cursor"] = cursor
    last = dict(state.get("last") or {})
    frames = _dedupe(raw, last)
    result = LiveResult(state=state, frames=frames)
    ev = raw.get("events")
    resumed = ev is not None and "kind" in ev and bool((ev["kind"] == "resume").any())
    if resumed or _redone(raw, last):  # a new attempt (its marker), or one that redoes steps the page drew:
        result.rebuild.update(state.get("specs") or {})  # drawn again from the store, each step once
    for table, df in frames.items():
        _advance(last, table, df)
    state["last"] = last
    steps = frames.get("steps")
    if steps is not None and len(steps) and "step" in steps:
        top = int(pd.to_numeric(steps["step"], errors="coerce").max())
        prev = state.get("last_step")
        state["last_step"] = top if prev is None else max(top, int(prev))
    result.new_events = "events" in frames
    result.new_activations = "activations" in frames
    tails = {k: dict(v) for k, v in (state.get("tails") or {}).items()}
    histories = {k: pd.DataFrame({c: pd.Series(vals, dtype=float) for c, vals in v.items()}) for k, v in tails.items()}
    t0 = float(state.get("t0") or 0.0)
    points = dict(state.get("points") or {})
    for graph, spec_dicts in (state.get("specs") or {}).items():
        specs = [Series.from_dict(d) for d in spec_dicts]
        keys = {s.key for s in specs}
        if not any(t in frames for t in ("steps", "memory", "host", "device")):
            continue
        if any(s.key not in keys for s in spec_fn(graph, frames)):
            result.rebuild.add(graph)
            continue
        xs, ys, idx = [], [], []
        for i, s in enumerate(specs):
            if s.table not in frames:
                continue
            df = frames[s.table]
            hist = histories.get(f"{s.rank}/{s.table}") if s.windowed else None
            x, y = series_xy(s, df, t0, hist)
            if x:
                xs.append(x)
                ys.append(y)
                idx.append(i)
        if not idx:
            continue
        grown = points.get(graph, 0) + max(len(x) for x in xs)
        if grown > LIVE_POINTS:
            result.rebuild.add(graph)
            continue
        points[graph] = grown
        result.extends[graph] = [{"x": xs, "y": ys}, idx]
    state["points"] = points
    if steps is not None and len(steps):
        for rank, g in steps.groupby("rank"):
            k = f"{rank}/steps"
            old = tails.get(k, {})
            merged = {c: (old.get(c, []) + [float(v) for v in g[c]])[-WINDOW:] for c in _TAIL_COLS if c in g}
            tails[k] = merged
    state["tails"] = tails
    state["status"] = reader.status()
    return result


@dataclass
class TickView:
    """What one live tick changes on the run page (None / empty: leave it as it is)."""

    state: dict[str, Any]
    #: graph -> ``extendData`` payload (graphs rebuilt are not in it)
    extends: dict[str, Any] = field(default_factory=dict)
    #: graph -> the whole figure, wired (:func:`gpudash.server.layouts.fig.wire`)
    figures: dict[str, Any] = field(default_factory=dict)
    #: the throughput panel's lines, when steps arrived
    stats: list[str] | None = None
    #: the events timeline (wired) and the table's rows, when events arrived or a graph was rebuilt
    events: tuple[Any, list[dict[str, Any]]] | None = None


def tick_view(reader: RunReader, lock: threading.Lock, state: dict[str, Any], facts: Any = None,
              drawn: Iterable[str] = (), smooth: float = 0.0) -> TickView:
    """One live tick of the run page: rows since ``state['cursor']`` read under ``lock``, the figures that must
    be rebuilt built from the run as it is now. ``facts``: the run's facts (phases, loss spikes); ``drawn``: the
    charts the page has drawn (a lazy one drawn after the page is rebuilt once, then extended like the others).
    ``state`` is a checked ``live-state``."""
    rank = int(state.get("rank", 0))
    phases = {"phases": list(facts.phases)} if facts is not None else None
    with lock:
        res = live_tick(reader, state, lambda g, f: run_page.graph_specs(g, f, rank, phases))
        res.rebuild.update(g for g in run_page.LIVE_GRAPHS if g in drawn and g not in state["specs"])
        view = load_view(reader) if (res.rebuild or res.new_events) else None
    new = res.state
    out = TickView(state=new, extends=dict(res.extends))
    if view is not None:
        for g in run_page.LIVE_GRAPHS:
            if g not in res.rebuild:
                continue
            fig, specs = run_page.build_graph(g, view, int(new.get("rank", 0)),
                                              spikes=list(facts.loss_spike_steps) if facts is not None else None,
                                              smooth=smooth, x=x_of(new))
            out.figures[g] = wire(fig)
            out.extends.pop(g, None)
            new["specs"][g] = [s.as_dict() for s in specs]
            new["points"][g] = max((len(t["x"]) for t in fig.data), default=0)
        out.events = (events.events_figure(view.frame("events")), events.event_rows(view.frame("events")))
    if res.frames.get("steps") is not None and facts is not None:  # the run's facts, as the summary says
        out.stats = throughput.stats_lines(facts)
    return out
