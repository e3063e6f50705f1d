"""Callbacks of the run page's live tick: every ``live-interval`` tick extends the live graphs with what the run
recorded since, rebuilds the ones that must be, and moves the last step, status, throughput, lights and events;
the events table shows the rows the tick keeps in the store.

:func:`live_outputs` is the callback's body, a pure function of the browser's payload and the run's readers
(the reading and the figures are :func:`gpudash.server.layouts.live.tick_view`'s)."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, html, no_update
from dash.exceptions import PreventUpdate
from gpudash.server.layouts import run_page, stability
from gpudash.server.layouts.inputs import BadInput, as_int, live_state
from gpudash.server.layouts.live import tick_view
from gpudash.server.layouts.pages import facts_for
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.viewstate import smoothing_of

__all__ = ["LIVE_OUTPUTS", "live_outputs", "register_live_callbacks"]

#: The live tick's outputs, in order (``(component id, property)``; figures are ``allow_duplicate``).
LIVE_OUTPUTS: tuple[tuple[str, str], ...] = (
    ("live-state", "data"), *((g, "extendData") for g in run_page.LIVE_GRAPHS),
    *((g, "figure") for g in run_page.LIVE_GRAPHS), ("last-step", "children"), ("run-status", "children"),
    ("run-status", "className"), ("cursor-slider", "max"), ("cursor-slider", "value"),
    ("throughput-stats", "children"), ("stability-lights", "children"), ("events-graph", "figure"),
    ("events-rows", "data"), ("live-interval", "max_intervals"))
_DUPLICATE = {*((g, "figure") for g in run_page.LIVE_GRAPHS), ("cursor-slider", "value")}


def live_outputs(n: Any, state: Any, cursor: Any, slider_max: Any, page: Any, smooth: Any, drawn: Any, *,
                 readers: ReaderCache) -> list[Any]:
    """One tick: ``live-interval.n_intervals``, then the states ``live-state``, the cursor slider's value and
    max, ``page-run``, ``smoothing`` and ``lazy-drawn``, to the values of :data:`LIVE_OUTPUTS`."""
    if not state or not isinstance(state, dict) or not state.get("run"):
        raise PreventUpdate
    state = live_state(state)
    cursor = None if cursor is None else as_int(cursor, "cursor")
    slider_max = None if slider_max is None else as_int(slider_max, "slider max")
    n = 0 if n is None else as_int(n, "n_intervals", lo=0)
    if page is not None and not isinstance(page, dict):
        raise BadInput("page-run must be an object")
    reader, lock = readers.get_or_skip(state["run"])
    prev_status = state.get("status")
    facts = facts_for(reader.path)  # the one run cache: re-judged as the run grows, so lights move
    tick = tick_view(reader, lock, state, facts, drawn if isinstance(drawn, list) else (), smoothing_of(smooth))
    new = tick.state
    graphs = run_page.LIVE_GRAPHS
    last = new.get("last_step")
    follow = cursor is None or slider_max is None or cursor >= slider_max
    status = str(new.get("status", "live"))
    changed = status != prev_status  # the summary panel re-runs the analysis only then
    stats = no_update if tick.stats is None else [html.Li(t) for t in tick.stats]
    ev_fig, ev_rows = tick.events if tick.events is not None else (no_update, no_update)
    return [new, *(tick.extends.get(g, no_update) for g in graphs), *(tick.figures.get(g, no_update) for g in graphs),
            "-" if last is None else str(last), status if changed else no_update,
            f"status status-{status}" if changed else no_update,
            no_update if last is None else max(last, 1), last if (follow and last is not None) else no_update,
            stats, stability.lights_row(stability.stability_lights(facts)), ev_fig, ev_rows,
            n + 1 if status != "live" else no_update]


def register_live_callbacks(app: dash.Dash, readers: ReaderCache) -> None:
    """The live tick (:func:`live_outputs`) and the events table fed from the rows it keeps."""

    @app.callback(
        [Output(i, p, allow_duplicate=True) if (i, p) in _DUPLICATE else Output(i, p) for i, p in LIVE_OUTPUTS],
        Input("live-interval", "n_intervals"),
        State("live-state", "data"), State("cursor-slider", "value"), State("cursor-slider", "max"),
        State("page-run", "data"), State("smoothing", "value"), State("lazy-drawn", "data"),
        running=[(Output("live-interval", "disabled"), True, False)],
        prevent_initial_call=True,
    )
    def live(n: Any, state: Any, cursor: Any, slider_max: Any, page: Any, smooth: Any = None,
             drawn: Any = None) -> list[Any]:
        return live_outputs(n, state, cursor, slider_max, page, smooth, drawn, readers=readers)

    # the events table, once built (scrolled to), shows the rows the live tick keeps in the store
    app.clientside_callback("function (rows) { return rows; }", Output("events-table", "data"),
                            Input("events-rows", "data"), prevent_initial_call=True)
