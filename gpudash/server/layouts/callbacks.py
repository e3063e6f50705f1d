"""Dash callbacks of the dashboard: routing, the live tick, the replay cursor, zoom re-queries.

Each callback is a thin wrapper: it finds the run's reader (ids resolved inside
RUNS_DIR only), calls a pure function from :mod:`gpudash.server.layouts` and returns
its result, an ``extendData`` payload, a ``Patch`` or ``no_update``.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import dash
from dash import Input, Output, Patch, State, dcc, html, no_update
from dash.exceptions import PreventUpdate
from gpudash.errors import RunError
from gpudash.server.layouts import compare, events, memory, ranks, run_page, runs, stability, throughput, xaxis
from gpudash.server.layouts.common import note
from gpudash.server.layouts.data import RunView, load_view
from gpudash.server.layouts.fig import wire
from gpudash.server.layouts.inputs import BadInput, as_float, as_int, live_state, page_run, rank_of
from gpudash.server.layouts.lazy import register_lazy_callbacks, wire_tree
from gpudash.server.layouts.links import href
from gpudash.server.layouts.live import live_tick
from gpudash.server.layouts.pages import (
    activations_at,
    build_run_page,
    facts_for,
    load_snapshots,
    memory_row_at,
    pick_snapshot,
    range_view,
    request_snapshot,
    segment_map_view,
    verdicts_for,
)
from gpudash.server.layouts.progressbar import register_progress_callbacks
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.runs_callbacks import register_runs_callbacks
from gpudash.server.layouts.snapshot_page import register_snapshot_page_callbacks
from gpudash.server.layouts.snapshot_views import register_snapshot_callbacks
from gpudash.server.layouts.viewstate import smoothing_of, view_params, view_search, xmode_of, zoom_range
from gpudash.server.layouts.xaxis_callbacks import register_xaxis_callbacks
from gpudash.store.bounded import damage
from gpudash.store.runid import InvalidRunId, resolve_run_dir

__all__ = ["ReaderCache", "SnapshotRequests", "event_inputs", "page_for", "register_callbacks", "view_params",
           "view_search", "zoom_range"]

_ZOOM_GRAPHS = {"memory-graph": "step", "step-time-graph": "step", "loss-graph": "step", "phases-graph": "step",
                "rates-graph": "step", "signals-graph": "step", "device-graph": "elapsed", "host-graph": "elapsed"}
#: Live ticks (500 ms each) between refreshes of the ranks section.
RANKS_EVERY = 10


class SnapshotRequests:
    """The "take a snapshot" button writes ``snapshot.request`` only into a live run, and at most once per
    ``every_s`` seconds per run (each request makes the training process dump its allocator)."""

    def __init__(self, every_s: float = 5.0, clock: Any = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def ask(self, run_id: str, run_dir: Path, status: str) -> str:
        if status != "live":
            return f"not requested: the run is {status}; only a live run can take a snapshot"
        with self._lock:
            now = self.clock()
            wait = self._last.get(run_id, -math.inf) + self.every_s - now
            if wait > 0:
                return f"not requested: one was asked {self.every_s - wait:.0f} s ago; wait {math.ceil(wait)} s"
            self._last[run_id] = now
        request_snapshot(run_dir)
        return f"requested at {time.strftime('%H:%M:%S')}: it appears after the next step"


def event_inputs(click: Any, cell: Any, rows: Any) -> tuple[dict[str, Any] | None, dict[str, Any] | None,
                                                            list[dict[str, Any]]]:
    """The events timeline click, table cell and table rows, reduced to the steps they point at."""
    def step(v: Any) -> int | None:
        return None if v is None else as_int(v, "event step")

    if rows is not None and (not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows)):
        raise BadInput("events-rows data must be a list of rows")
    clean_rows = [{"step": step(r.get("step"))} for r in rows or []]
    clean_click = None
    if click is not None:
        points = click.get("points") if isinstance(click, dict) else None
        if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
            raise BadInput("clickData must be {'points': [...]}")
        clean_click = {"points": [{"customdata": step(p.get("customdata", p.get("x")))} for p in points[:1]]}
    clean_cell = None
    if cell is not None:
        if not isinstance(cell, dict):
            raise BadInput("active_cell must be an object")
        clean_cell = {"row": as_int(cell.get("row"), "table row", lo=0)}
    return clean_click, clean_cell, clean_rows


def page_for(pathname: str, search: str, runs_dir: Path, readers: ReaderCache) -> Any:
    if not isinstance(pathname, str) or not isinstance(search, str):
        raise BadInput("the page address must be a string")
    if pathname in ("", "/"):
        listing = runs.list_page(runs_dir)
        return runs.runs_page(runs_dir, listing.rows, listing)
    if pathname.startswith("/run/"):
        run_id = pathname[len("/run/"):].strip("/")
        try:
            reader, lock = readers.get(run_id)
        except (InvalidRunId, RunError):
            return html.Div([dcc.Link("← all runs", href=href("/")), note(f"no run named {run_id!r} in {runs_dir}")],
                            id="not-found")
        query = parse_qs(search.lstrip("?"))
        try:  # a rank typed into the address: the first rank when it is not one
            rank = rank_of(query.get("rank", ["0"])[0])
        except BadInput:
            rank = 0
        cursor, xrange, smooth = view_params(query)
        try:
            with lock:
                return build_run_page(run_id, reader, rank, cursor=cursor, xrange=xrange, smooth=smooth,
                                      xmode=xmode_of(query))
        except Exception as exc:  # noqa: BLE001 - someone else's damaged run: one line, the other runs still served
            return html.Div([dcc.Link("← all runs", href=href("/")),
                             note(f"{run_id}: damaged, the page cannot be drawn ({damage(exc)})")], id="run-damaged")
    if pathname == "/compare":
        query = parse_qs(search.lstrip("?"))
        wanted = [r for r in ",".join(query.get("runs", [])).split(",") if r]
        views, missing, facts = [], [], []
        for run_id in wanted[:8]:
            try:
                reader, lock = readers.get(run_id)
            except (InvalidRunId, RunError):
                missing.append(run_id)
                continue
            with lock:
                view = load_view(reader)
            views.append((str(view.meta.get("name") or run_id), view))
            facts.append(facts_for(reader.path))
        try:
            baseline = as_int(query.get("base", ["0"])[0], "baseline", lo=0, hi=len(views))
        except BadInput:
            baseline = 0
        return compare.compare_page(views, missing, facts, baseline)
    return html.Div([dcc.Link("← all runs", href=href("/")), note(f"no page {pathname}")], id="not-found")


def register_callbacks(app: dash.Dash, runs_dir: Path, readers: ReaderCache) -> None:
    graphs = run_page.LIVE_GRAPHS
    prefix = str(app.config.requests_pathname_prefix).rstrip("/")  # a proxy's path (notebook), else ""

    @app.callback(Output("page", "children"), Output("shown-page", "data"), Input("url", "pathname"),
                  Input("url", "search"), State("shown-page", "data"))
    def route(pathname: str | None, search: str | None, shown: Any) -> Any:
        # the view's own address changes (cursor, zoom) keep the page that wrote them
        pathname, search = pathname or "/", search or ""
        if not isinstance(pathname, str) or not isinstance(search, str):
            raise BadInput("the page address must be a string")
        if prefix and (pathname + "/").startswith(prefix + "/"):
            pathname = pathname[len(prefix):] or "/"
        query = parse_qs(search.lstrip("?"))
        here: dict[str, Any] = {"path": pathname, "rank": query.get("rank", ["0"])[0]}
        if not pathname.startswith("/run/"):  # other pages redraw for their query, not for the theme's
            here["query"] = [[k, v] for k, v in sorted(query.items()) if k != "theme"]  # as the store echoes it
        if "url.pathname" not in dash.ctx.triggered_prop_ids and shown == here:
            raise PreventUpdate
        return wire_tree(page_for(pathname, search, runs_dir, readers)), here  # figures as typed arrays

    @app.callback(Output("url", "search"),
                  Input("cursor-slider", "value"), Input("smoothing", "value"),
                  *(Input(g, "relayoutData") for g in run_page.STEP_GRAPHS),
                  State("url", "search"), State("run-status", "children"), State("cursor-slider", "max"),
                  State("live-state", "data"), prevent_initial_call=True)
    def view_to_url(cursor: Any, smooth: Any, *rest: Any) -> str:
        # the view in the address: a copied link opens the same cursor and zoom. The run's end is no cursor (a
        # page opens there; a live run's end moves): a page just opened keeps its address as typed
        *relayouts, search, status, hi, state = rest
        if not isinstance(search, str | None) or not isinstance(status, str | None):
            raise BadInput("search and status must be strings")
        cursor = None if cursor is None else as_int(cursor, "cursor")
        hi = None if hi is None else as_int(hi, "slider max")
        if cursor is not None and hi is not None and cursor >= hi:
            cursor = None
        trig = dash.ctx.triggered_id
        zoom = None
        if trig in run_page.STEP_GRAPHS:
            zoom = xaxis.zoom_steps(relayouts[run_page.STEP_GRAPHS.index(trig)], state, readers)
        out = view_search(search or "", cursor, zoom, smoothing_of(smooth))
        if out == (search or ""):
            raise PreventUpdate
        return out

    register_runs_callbacks(app, runs_dir)
    register_xaxis_callbacks(app, readers)
    register_progress_callbacks(app, lambda run_id: facts_for(readers.get_or_skip(run_id)[0].path))

    @app.callback(
        [Output("live-state", "data"), *(Output(g, "extendData") for g in graphs),
         *(Output(g, "figure", allow_duplicate=True) for g in graphs),
         Output("last-step", "children"), Output("run-status", "children"), Output("run-status", "className"),
         Output("cursor-slider", "max"), Output("cursor-slider", "value", allow_duplicate=True),
         Output("throughput-stats", "children"), Output("stability-lights", "children"),
         Output("events-graph", "figure"), Output("events-rows", "data"), Output("live-interval", "max_intervals")],
        Input("live-interval", "n_intervals"),
        State("live-state", "data"), State("cursor-slider", "value"), State("cursor-slider", "max"),
        State("page-run", "data"), State("smoothing", "value"), State("lazy-drawn", "data"),
        running=[(Output("live-interval", "disabled"), True, False)],
        prevent_initial_call=True,
    )
    def live(n: int, state: dict[str, Any], cursor: int | None, slider_max: int | None,
             page: dict[str, Any] | None, smooth: Any = None, drawn: Any = None) -> Any:
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
        with lock:
            phases = {"phases": list(facts.phases)} if facts is not None else None
            res = live_tick(reader, state, lambda g, f: run_page.graph_specs(g, f, int(state.get("rank", 0)), phases))
            # a chart drawn after the page (scrolled to) is rebuilt once here, then extended like the others
            res.rebuild.update(g for g in graphs if isinstance(drawn, list) and g in drawn and g not in state["specs"])
            view: RunView | None = load_view(reader) if (res.rebuild or res.new_events) else None
        new = res.state
        extends = [res.extends.get(g, no_update) for g in graphs]
        figures: list[Any] = [no_update] * len(graphs)
        if view is not None:
            for i, g in enumerate(graphs):
                if g in res.rebuild:
                    fig, specs = run_page.build_graph(g, view, int(new.get("rank", 0)),
                                                      spikes=list(facts.loss_spike_steps) if facts else None,
                                                      smooth=smoothing_of(smooth), x=xaxis.x_of(new))
                    figures[i] = wire(fig)
                    extends[i] = no_update
                    new["specs"][g] = [s.as_dict() for s in specs]
                    new["points"][g] = max((len(t["x"]) for t in fig.data), default=0)
        last = new.get("last_step")
        follow = cursor is None or slider_max is None or cursor >= slider_max
        status = str(new.get("status", "live"))
        done = status != "live"
        stats: Any = no_update
        lights: Any = no_update
        ev_fig: Any = no_update
        ev_rows: Any = no_update
        if res.frames.get("steps") is not None and facts is not None:  # the run's facts, as the summary says
            stats = [html.Li(t) for t in throughput.stats_lines(facts)]
        lights = stability.lights_row(stability.stability_lights(facts))
        if view is not None:
            ev_fig = events.events_figure(view.frame("events"))
            ev_rows = events.event_rows(view.frame("events"))
        changed = status != prev_status  # the summary panel re-runs the analysis only then
        return [new, *extends, *figures, "-" if last is None else str(last), status if changed else no_update,
                f"status status-{status}" if changed else no_update,
                no_update if last is None else max(last, 1), last if (follow and last is not None) else no_update,
                stats, lights, ev_fig, ev_rows, (n or 0) + 1 if done else no_update]

    # the events table, once built (scrolled to), shows the rows the live tick keeps in the store
    app.clientside_callback("function (rows) { return rows; }", Output("events-table", "data"),
                            Input("events-rows", "data"), prevent_initial_call=True)

    @app.callback(Output("play-interval", "disabled"), Output("play-button", "children"),
                  Input("play-button", "n_clicks"), State("play-interval", "disabled"), prevent_initial_call=True)
    def toggle_play(_: int, disabled: bool) -> tuple[bool, str]:
        return (False, "⏸ pause") if disabled else (True, "▶ play")

    @app.callback(
        Output("cursor-slider", "value"),
        Input("play-interval", "n_intervals"), Input("prev-event", "n_clicks"), Input("next-event", "n_clicks"),
        Input("events-graph", "clickData"), Input("events-table", "active_cell", allow_optional=True),
        Input("cursor-input", "n_submit"),
        State("cursor-slider", "value"), State("cursor-slider", "min"), State("cursor-slider", "max"),
        State("speed", "value"), State("page-run", "data"), State("events-rows", "data"), State("cursor-input", "value"),
        prevent_initial_call=True,
    )
    def move_cursor(_n: int, _p: int, _x: int, click: Any, cell: Any, _enter: int | None, value: int | None, lo: int,
                    hi: int, speed: int, page: dict[str, Any], rows: list[dict[str, Any]], typed: Any) -> int:
        trigger = dash.ctx.triggered_id
        lo, hi = as_int(lo or 0, "slider min"), as_int(hi or 0, "slider max")
        value = as_int(value if value is not None else lo, "cursor")
        if trigger == "cursor-input":  # Enter in the step box: that step, within the run
            if typed is None or typed == "":
                raise PreventUpdate
            return min(max(round(as_float(typed, "step")), lo), hi)
        click, cell, rows = event_inputs(click, cell, rows)
        if trigger == "play-interval":
            step_s = as_float((page or {}).get("step_s") or 0.1, "step_s") if isinstance(page, dict | None) else 0.1
            per_tick = min(run_page.TICK_MS / 1000 * as_float(speed or 1, "speed") / max(step_s, 1e-6), float(2**53))
            nxt = value + max(1, round(per_tick))
            return lo if value >= hi else min(nxt, hi)
        if trigger in ("prev-event", "next-event"):
            steps = [r["step"] for r in rows if r.get("step") is not None]
            target = events.neighbor_event(steps, value, 1 if trigger == "next-event" else -1)
            if target is None:
                raise PreventUpdate
            return target
        step = events.event_step(click if trigger == "events-graph" else None,
                                 cell if trigger == "events-table" else None, rows)
        if step is None:
            raise PreventUpdate
        return step

    @app.callback(
        [Output("cursor-label", "children"), Output("memory-at-graph", "figure"), Output("segment-map-box", "children"),
         Output("activations-box", "children"), Output("cursor-follow", "data"),
         *(Output(g, "figure", allow_duplicate=True) for g in run_page.CURSOR_GRAPHS)],
        Input("cursor-slider", "value"), Input("snapshot-pick", "value"), State("page-run", "data"),
        State("cursor-slider", "max"), State("run-status", "children"), State("cursor-follow", "data"),
        prevent_initial_call=True,
    )
    def follow_cursor(step: int | None, pick: str | None, page: dict[str, Any], slider_max: int | None,
                      status: str | None, prev: dict[str, Any] | None) -> list[Any]:
        if step is None or not page:
            raise PreventUpdate
        run_id, rank = page_run(page)
        step = as_int(step, "cursor")
        slider_max = None if slider_max is None else as_int(slider_max, "slider max")
        if not isinstance(pick, str | None) or not isinstance(status, str | None) \
                or not isinstance(prev, dict | None):
            raise BadInput("snapshot pick, status and cursor-follow must be strings and an object")
        reader, lock = readers.get_or_skip(run_id)
        prev = prev or {}
        # following a live run: the cursor is the newest step, so no cursor line, and the snapshot and
        # activation views are resent only when a newer one exists
        follow = status == "live" and (slider_max is None or step >= slider_max) and dash.ctx.triggered_id \
            == "cursor-slider"
        with lock:
            rows = memory_row_at(reader, step, rank)
            maps = load_snapshots(reader)
            acts = activations_at(reader, step, rank)
            has_acts = bool(len(acts)) or (rank in reader.ranks and reader.ranks[rank].max_rowid("activations") > 0)
            meta = dict(reader.run_meta(), **(reader.rank_meta().get(rank) or {}))
        snap_key = [len(maps), pick, getattr(pick_snapshot(maps, step, pick), "step", None)]
        act_key = int(acts["step"].max()) if len(acts) else None
        seg_child: Any = no_update
        if not (follow and prev.get("snap") == snap_key):
            seg = segment_map_view(maps, step, pick, meta)
            seg_child = note(seg) if isinstance(seg, str) else \
                dcc.Graph(id="segment-map", figure=seg, config=run_page.GRAPH_CONFIG)
        act_child: Any = no_update
        if (len(acts) or has_acts) and not (follow and prev.get("act") == act_key):
            # before the first sampled step the chart says so (it does not keep showing another step's)
            act_child = dcc.Graph(id="activations-graph", figure=memory.activations_figure(acts, step, rank),
                                  config=run_page.GRAPH_CONFIG)
        patches: list[Any] = []
        for _ in run_page.CURSOR_GRAPHS:
            if follow and prev.get("follow"):
                patches.append(no_update)
                continue
            p = Patch()
            p["layout"]["shapes"][0]["x0"] = step
            p["layout"]["shapes"][0]["x1"] = step
            p["layout"]["shapes"][0]["visible"] = not follow
            patches.append(p)
        state = {"follow": follow, "snap": snap_key, "act": act_key}
        return [str(step), memory.memory_at_figure(memory.memory_at(rows, step, rank)), seg_child, act_child, state,
                *patches]

    @app.callback(Output("snapshot-requested", "children"), Input("snapshot-request", "n_clicks"),
                  State("page-run", "data"), prevent_initial_call=True)
    def snapshot_now(_n: int, page: dict[str, Any] | None) -> str:
        if not page:
            raise PreventUpdate
        run_id, _ = page_run(page)
        reader, lock = readers.get_or_skip(run_id)
        with lock:
            status = reader.status()
        return snapshots.ask(run_id, reader.path, status)

    @app.callback(Output("loss-graph", "figure", allow_duplicate=True), Output("rates-graph", "figure", allow_duplicate=True),
                  Output("live-state", "data", allow_duplicate=True),
                  Input("smoothing", "value"), State("live-state", "data"), State("cursor-slider", "value"),
                  prevent_initial_call=True)
    def smoothing(value: Any, state: Any, cursor: Any) -> Any:
        # raw drawn faint under its EMA; the live tick extends the new traces (their specs go into the state)
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
                                              cursor if g in run_page.CURSOR_GRAPHS else None,
                                              spikes=list(facts.loss_spike_steps) if facts is not None else None,
                                              smooth=smooth, x=xaxis.x_of(state))
            new["specs"][g] = [s.as_dict() for s in specs]
            new["points"][g] = max((len(t["x"]) for t in fig.data), default=0)
            out.append(wire(fig))
        return [*out, new]

    snapshots = SnapshotRequests()
    for graph_id, xmode in _ZOOM_GRAPHS.items():
        _register_zoom(app, readers, graph_id, xmode)
    _register_ranks(app, readers)
    register_snapshot_callbacks(app, readers)
    register_snapshot_page_callbacks(app, readers)
    register_lazy_callbacks(app, readers)

    @app.callback(Output("summary-panel", "children"), Output("summary-panel", "style"),
                  Input("summary-timer", "n_intervals"), Input("run-status", "children"), State("page-run", "data"),
                  prevent_initial_call=True)
    def summary(_n: int, _status: str | None, page: dict[str, Any] | None) -> tuple[Any, dict[str, str]]:
        # after the first paint (the timer): the analysis reads every row of the run
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


def _register_ranks(app: dash.Dash, readers: ReaderCache) -> None:
    @app.callback(Output("ranks-box", "children"), Input("live-interval", "n_intervals"),
                  Input("run-status", "children"), State("page-run", "data"), prevent_initial_call=True)
    def ranks_refresh(n: int | None, _status: str | None, page: dict[str, Any] | None) -> Any:
        # a live run: every RANKS_EVERY ticks (the skew reads both ranks' tables), and once when it ends
        n = 0 if n is None else as_int(n, "n_intervals", lo=0)
        if not page or (dash.ctx.triggered_id == "live-interval" and n % RANKS_EVERY):
            raise PreventUpdate
        reader, lock = readers.get_or_skip(page_run(page)[0])
        with lock:
            reader.refresh()
            if len(reader.ranks) < 2:
                raise PreventUpdate
            view = load_view(reader)
        return ranks.ranks_box(view.frame("steps"), view.frame("memory"), ranks.rank_nodes(reader.rank_meta()))


def _register_zoom(app: dash.Dash, readers: ReaderCache, graph_id: str, xmode: str) -> None:
    @app.callback(Output(graph_id, "figure", allow_duplicate=True), Input(graph_id, "relayoutData"),
                  State("live-state", "data"), State("cursor-slider", "value"), State("smoothing", "value"),
                  prevent_initial_call=True)
    def requery(relayout: dict[str, Any] | None, state: dict[str, Any], cursor: int | None, smooth: Any = None) -> Any:
        x = xaxis.x_of(state) if xmode == "step" else None  # the step graphs' axis may be in time
        rng = xaxis.axis_range(relayout, x)
        if rng is None or not state or not isinstance(state, dict) or not state.get("downsampled"):
            raise PreventUpdate
        state = live_state(state)
        cursor = None if cursor is None else as_int(cursor, "cursor")
        reader, lock = readers.get_or_skip(state["run"])
        steps = xaxis.steps_in(reader, lock, rng, x) if isinstance(rng, tuple) and x is not None and x.timed \
            else rng
        with lock:
            view = load_view(reader)
            if isinstance(steps, tuple):
                view = range_view(reader, view, steps[0], steps[1], xmode)
        facts = facts_for(reader.path)
        fig, _ = run_page.build_graph(graph_id, view, int(state.get("rank", 0)), cursor, smooth=smoothing_of(smooth),
                                      spikes=list(facts.loss_spike_steps) if facts is not None else None, x=x)
        if isinstance(rng, tuple):
            fig.update_xaxes(range=list(rng))
        return wire(fig)
