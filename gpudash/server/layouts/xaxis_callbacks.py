"""Callbacks of the step graphs' x axis (:mod:`gpudash.server.layouts.xaxis`): the header's control redraws the step
graphs in the new units, switches the live state's series and writes ``x=`` into the address; the replay
cursor's line goes to its step's time."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import dash
from dash import Input, Output, Patch, State
from dash.exceptions import PreventUpdate
from gpudash.server.layouts import run_page
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.fig import wire
from gpudash.server.layouts.inputs import BadInput, as_int, live_state
from gpudash.server.layouts.pages import facts_for, range_view
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.viewstate import mode_of, smoothing_of, view_params, with_xmode
from gpudash.server.layouts.xaxis import XAxis, cursor_ms, time_range_of, x_of, x_origin

__all__ = ["cursor_in_time", "register_xaxis_callbacks", "switch_x"]


def switch_x(mode: Any, state: Any, search: Any, cursor: Any, smooth: Any, *, readers: ReaderCache) -> list[Any]:
    """The step graphs drawn again with the x axis ``mode`` (zoomed as the address says), ``live-state`` with
    their new series and axis, and the address with ``x=``. States: ``live-state``, the address's search, the
    cursor, the smoothing."""
    graphs = run_page.STEP_GRAPHS
    if not state or not isinstance(state, dict) or not state.get("run"):
        raise PreventUpdate
    if not isinstance(search, str | None):
        raise BadInput("search must be a string")
    mode = mode_of(mode)
    state = live_state(state)
    if x_of(state).mode == mode:
        raise PreventUpdate
    cursor = None if cursor is None else as_int(cursor, "cursor")
    rank = int(state.get("rank", 0))
    reader, lock = readers.get_or_skip(state["run"])
    with lock:
        view = load_view(reader)
        _, zoom, _ = view_params(parse_qs((search or "").lstrip("?")))
        zoomed = range_view(reader, view, zoom[0], zoom[1]) if zoom is not None else view
    full = view.full.get("steps", view.frame("steps"))
    x = XAxis(mode, x_origin(mode, full))
    facts = facts_for(reader.path)
    live = view.status == "live"
    new = dict(state, specs=dict(state.get("specs") or {}), points=dict(state.get("points") or {}), x=x.as_dict())
    figs: list[Any] = []
    for g in graphs:
        at = cursor if g in run_page.CURSOR_GRAPHS and not (live and cursor is not None
                                                             and cursor >= (view.last_step or 0)) else None
        fig, specs = run_page.build_graph(g, zoomed, rank, at, smooth=smoothing_of(smooth), x=x,
                                          spikes=list(facts.loss_spike_steps) if facts is not None else None)
        if zoom is not None:
            rng = time_range_of(full, x, *zoom) if x.timed else list(zoom)
            if rng is not None:
                fig.update_xaxes(range=rng)
        new["specs"][g] = [s.as_dict() for s in specs]
        new["points"][g] = max((len(t["x"]) for t in fig.data), default=0)
        figs.append(wire(fig))
    return [*figs, new, with_xmode(search or "", mode)]


def cursor_in_time(label: Any, state: Any, *, readers: ReaderCache) -> list[Any]:
    """The cursor line's patches on a time axis: the replay callback puts the line at the step (its label),
    this moves it to that step's time."""
    # the replay callback puts the cursor line at the step; on a time axis it goes to that step's time
    if not state or not isinstance(state, dict) or not state.get("run"):
        raise PreventUpdate
    x = x_of(state)
    if not x.timed or label in (None, "-"):
        raise PreventUpdate
    step = as_int(label, "cursor")
    reader, lock = readers.get_or_skip(str(state["run"]))
    at = cursor_ms(reader, lock, as_int(state.get("rank", 0), "rank", lo=0), step, x)
    if at is None:
        raise PreventUpdate
    out: list[Any] = []
    for _ in run_page.CURSOR_GRAPHS:
        p = Patch()
        p["layout"]["shapes"][0]["x0"] = at
        p["layout"]["shapes"][0]["x1"] = at
        out.append(p)
    return out


def register_xaxis_callbacks(app: dash.Dash, readers: ReaderCache) -> None:
    """The x axis control (:func:`switch_x`) and the cursor line moved to its step's time
    (:func:`cursor_in_time`). ``readers``: the callbacks' ReaderCache."""
    graphs = run_page.STEP_GRAPHS

    @app.callback([*(Output(g, "figure", allow_duplicate=True) for g in graphs),
                   Output("live-state", "data", allow_duplicate=True), Output("url", "search", allow_duplicate=True)],
                  Input("x-mode", "value"), State("live-state", "data"), State("url", "search"),
                  State("cursor-slider", "value"), State("smoothing", "value"), prevent_initial_call=True)
    def x_mode(mode: Any, state: Any, search: Any, cursor: Any, smooth: Any) -> list[Any]:
        return switch_x(mode, state, search, cursor, smooth, readers=readers)

    @app.callback([Output(g, "figure", allow_duplicate=True) for g in run_page.CURSOR_GRAPHS],
                  Input("cursor-label", "children"), State("live-state", "data"), prevent_initial_call=True)
    def cursor_line(label: Any, state: Any) -> list[Any]:
        return cursor_in_time(label, state, readers=readers)
