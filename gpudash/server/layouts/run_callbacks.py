"""Callbacks of the run page's view: the view written into the address (cursor, zoom, smoothing), the loss
and rates charts redrawn for a new smoothing, a zoom on a downsampled chart re-queried at full resolution, the
Ranks section refreshed, and the summary panel filled after the first paint.

Each callback's body is a pure function of the browser's payload (the input that fired passed in as
``trigger``) and the run's readers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dash
from dash import Input, Output, State
from dash.exceptions import PreventUpdate
from gpudash.server.layouts import ranks, run_page, xaxis
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.fig import wire
from gpudash.server.layouts.inputs import BadInput, as_int, live_state, page_run
from gpudash.server.layouts.pages import facts_for, range_view, verdicts_for
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.viewstate import ZOOM_JS, smoothing_of, view_search, zoom_store
from gpudash.store.runid import InvalidRunId, resolve_run_dir

__all__ = ["RANKS_EVERY", "RANKS_TICK_JS", "ZOOM_GRAPHS", "ranks_refresh", "register_run_callbacks", "smoothing_redraw",
           "summary_panel", "view_address", "zoom_redraw"]

#: The graphs a zoom re-queries, and their x axis ("step": the step graphs, whose axis may be in time).
ZOOM_GRAPHS = {"memory-graph": "step", "step-time-graph": "step", "loss-graph": "step", "phases-graph": "step",
               "rates-graph": "step", "signals-graph": "step", "device-graph": "elapsed", "host-graph": "elapsed"}
#: Live ticks (500 ms each) between refreshes of the ranks section.
RANKS_EVERY = 10
#: Passes on every RANKS_EVERY-th live tick only (the browser side of the ranks refresh).
RANKS_TICK_JS = ("function(n) { return (n && n % " + str(RANKS_EVERY) + " === 0) ? n : window.dash_clientside.no_update; }")


def _spikes(facts: Any) -> list[int] | None:
    return list(facts.loss_spike_steps) if facts is not None else None


def view_address(cursor: Any, smooth: Any, relayouts: list[Any], search: Any, status: Any, hi: Any, state: Any, *,
                 trigger: Any, readers: ReaderCache) -> str:
    """The address's query for the view: the cursor, a step graph's zoom (``relayouts``: one relayoutData per
    ``run_page.STEP_GRAPHS``; ``trigger`` says which fired) and the smoothing; states: the address's search, the
    run's status, the slider's max, ``live-state``. A copied link opens the same cursor and zoom. The run's end
    is no cursor (a page opens there; a live run's end moves): a page just opened keeps its address as typed."""
    if not isinstance(search, str | None) or not isinstance(status, str | None):
        raise BadInput("search and status must be strings")
    cursor = None if cursor is None else as_int(cursor, "cursor")
    hi = None if hi is None else as_int(hi, "slider max")
    if cursor is not None and hi is not None and cursor >= hi:
        cursor = None
    zoom = None
    if trigger in run_page.STEP_GRAPHS:
        zoom = xaxis.zoom_steps(relayouts[run_page.STEP_GRAPHS.index(trigger)], state, readers)
    out = view_search(search or "", cursor, zoom, smoothing_of(smooth))
    if out == (search or ""):
        raise PreventUpdate
    return out


def smoothing_redraw(value: Any, state: Any, cursor: Any, *, readers: ReaderCache) -> list[Any]:
    """The loss and rates charts drawn again for the smoothing ``value`` (raw drawn faint under its EMA), and
    ``live-state`` with their new series (the live tick extends those)."""
    if not state or not isinstance(state, dict) or not state.get("run"):
        raise PreventUpdate
    state = live_state(state)
    smooth = smoothing_of(value)
    cursor = None if cursor is None else as_int(cursor, "cursor")
    reader, lock = readers.get_or_skip(state["run"])
    with lock:
        view = load_view(reader)
    facts = facts_for(reader.path)
    out: list[Any] = []
    new = dict(state, specs=dict(state.get("specs") or {}), points=dict(state.get("points") or {}))
    for g in ("loss-graph", "rates-graph"):
        fig, specs = run_page.build_graph(g, view, int(state.get("rank", 0)),
                                          cursor if g in run_page.CURSOR_GRAPHS else None, spikes=_spikes(facts),
                                          smooth=smooth, x=xaxis.x_of(state))
        new["specs"][g] = [s.as_dict() for s in specs]
        new["points"][g] = max((len(t["x"]) for t in fig.data), default=0)
        out.append(wire(fig))
    return [*out, new]


def zoom_redraw(graph_id: str, relayout: Any, state: Any, cursor: Any, smooth: Any, *, readers: ReaderCache) -> Any:
    """``graph_id`` drawn again for the range its ``relayout`` zoomed to (the rows of that range, downsampled
    again), or whole on a double-click; only where ``live-state`` says the page's charts were downsampled."""
    xmode = ZOOM_GRAPHS[graph_id]
    x = xaxis.x_of(state) if xmode == "step" else None  # the step graphs' axis may be in time
    rng = xaxis.axis_range(relayout, x)
    if rng is None or not state or not isinstance(state, dict) or not state.get("downsampled"):
        raise PreventUpdate
    state = live_state(state)
    cursor = None if cursor is None else as_int(cursor, "cursor")
    reader, lock = readers.get_or_skip(state["run"])
    steps = xaxis.steps_in(reader, lock, rng, x) if isinstance(rng, tuple) and x is not None and x.timed else rng
    with lock:
        view = load_view(reader)
        if isinstance(steps, tuple):
            view = range_view(reader, view, steps[0], steps[1], xmode)
    facts = facts_for(reader.path)
    fig, _ = run_page.build_graph(graph_id, view, int(state.get("rank", 0)), cursor, smooth=smoothing_of(smooth),
                                  spikes=_spikes(facts), x=x)
    if isinstance(rng, tuple):
        fig.update_xaxes(range=list(rng))
    return wire(fig)


def ranks_refresh(n: Any, page: Any, *, trigger: Any, readers: ReaderCache) -> Any:
    """The Ranks section of a run with several ranks: every :data:`RANKS_EVERY` live ticks (the skew reads
    both ranks' tables; ``n`` the tick, from ``ranks-tick``), and once when the run ends (``trigger`` is then
    ``run-status``)."""
    n = 0 if n is None else as_int(n, "n_intervals", lo=0)
    if not page or (trigger in ("ranks-tick", "live-interval") and n % RANKS_EVERY):
        raise PreventUpdate
    reader, lock = readers.get_or_skip(page_run(page)[0])
    with lock:
        reader.refresh()
        if len(reader.ranks) < 2:
            raise PreventUpdate
        view = load_view(reader)
    return ranks.ranks_box(view.frame("steps"), view.frame("memory"), ranks.rank_nodes(reader.rank_meta()),
                           view.full_frames())


def summary_panel(page: Any, *, runs_dir: Path) -> tuple[Any, dict[str, str]]:
    """The summary panel's verdicts and style (hidden when there are none); after the first paint, since the
    analysis reads every row of the run."""
    if not page:
        raise PreventUpdate
    try:
        path = resolve_run_dir(runs_dir, page_run(page)[0])
    except InvalidRunId:
        raise PreventUpdate from None
    verdicts = verdicts_for(path)
    if not verdicts:
        return [], {"display": "none"}
    return run_page.summary_children(verdicts), {}


def register_run_callbacks(app: dash.Dash, runs_dir: Path, readers: ReaderCache) -> None:
    """The run page's view callbacks: :func:`view_address`, :func:`smoothing_redraw`, :func:`zoom_redraw` for
    each of :data:`ZOOM_GRAPHS`, :func:`ranks_refresh` and :func:`summary_panel`."""

    @app.callback(Output("url", "search"),
                  Input("cursor-slider", "value"), Input("smoothing", "value"),
                  *(Input(zoom_store(g), "data") for g in run_page.STEP_GRAPHS),
                  State("url", "search"), State("run-status", "children"), State("cursor-slider", "max"),
                  State("live-state", "data"), prevent_initial_call=True)
    def view_to_url(cursor: Any, smooth: Any, *rest: Any) -> str:
        *relayouts, search, status, hi, state = rest
        zoomed = {zoom_store(g): g for g in run_page.STEP_GRAPHS}
        trigger = zoomed.get(dash.ctx.triggered_id, dash.ctx.triggered_id)  # a zoom store: its graph
        return view_address(cursor, smooth, relayouts, search, status, hi, state, trigger=trigger, readers=readers)

    @app.callback(Output("loss-graph", "figure", allow_duplicate=True),
                  Output("rates-graph", "figure", allow_duplicate=True),
                  Output("live-state", "data", allow_duplicate=True),
                  Input("smoothing", "value"), State("live-state", "data"), State("cursor-slider", "value"),
                  prevent_initial_call=True)
    def smoothing(value: Any, state: Any, cursor: Any) -> list[Any]:
        return smoothing_redraw(value, state, cursor, readers=readers)

    for graph_id in ZOOM_GRAPHS:
        _register_zoom(app, readers, graph_id)

    # every RANKS_EVERY-th tick reaches the server through ranks-tick: fed each tick, the callback's slow answer
    # (both ranks' tables read) was dropped by Dash as outdated when the next tick came first, so on a loaded
    # server the section never refreshed while live
    app.clientside_callback(RANKS_TICK_JS, Output("ranks-tick", "data"), Input("live-interval", "n_intervals"),
                            prevent_initial_call=True)

    @app.callback(Output("ranks-box", "children"), Input("ranks-tick", "data"),
                  Input("run-status", "children"), State("page-run", "data"), prevent_initial_call=True)
    def ranks_box(n: Any, _status: Any, page: Any) -> Any:
        return ranks_refresh(n, page, trigger=dash.ctx.triggered_id, readers=readers)

    @app.callback(Output("summary-panel", "children"), Output("summary-panel", "style"),
                  Input("summary-timer", "n_intervals"), Input("run-status", "children"), State("page-run", "data"),
                  prevent_initial_call=True)
    def summary(_n: Any, _status: Any, page: Any) -> tuple[Any, dict[str, str]]:
        return summary_panel(page, runs_dir=runs_dir)


def _register_zoom(app: dash.Dash, readers: ReaderCache, graph_id: str) -> None:
    # a chart's own {"autosize": true} right after a zoom would re-fire the zoom's callback while its answer was
    # in flight, and Dash would drop the answer: only x-range changes pass, through the graph's zoom store
    app.clientside_callback(ZOOM_JS, Output(zoom_store(graph_id), "data"), Input(graph_id, "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(Output(graph_id, "figure", allow_duplicate=True), Input(zoom_store(graph_id), "data"),
                  State("live-state", "data"), State("cursor-slider", "value"), State("smoothing", "value"),
                  prevent_initial_call=True)
    def requery(relayout: Any, state: Any, cursor: Any, smooth: Any = None) -> Any:
        return zoom_redraw(graph_id, relayout, state, cursor, smooth, readers=readers)
