"""Dash callbacks of the dashboard: routing, the live tick, the replay cursor, zoom re-queries.

Each callback is a thin wrapper: it finds the run's reader (ids resolved inside
RUNS_DIR only), calls a pure function from :mod:`gpudash.layouts` and returns
its result, an ``extendData`` payload, a ``Patch`` or ``no_update``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
from dash import ALL, Input, Output, Patch, State, dcc, html, no_update
from dash.exceptions import PreventUpdate
from gpudash.layouts import compare, events, memory, ranks, run_page, runs, stability, throughput
from gpudash.layouts.common import note
from gpudash.layouts.data import RunView, load_view
from gpudash.layouts.live import live_tick
from gpudash.layouts.pages import (
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
from gpudash.layouts.runid import InvalidRunId, resolve_run_dir
from gpudash.store.reader import RunError, RunReader

__all__ = ["ReaderCache", "page_for", "register_callbacks", "zoom_range"]

_ZOOM_GRAPHS = {"memory-graph": "step", "step-time-graph": "step", "loss-graph": "step", "phases-graph": "step",
                "rates-graph": "step", "signals-graph": "step", "device-graph": "elapsed", "host-graph": "elapsed"}
#: Live ticks (500 ms each) between refreshes of the ranks section.
RANKS_EVERY = 10


class ReaderCache:
    """Open readers by run id (bounded), one lock each: SQLite connections are not shared mid-query."""

    def __init__(self, runs_dir: Path, size: int = 32) -> None:
        self.runs_dir = runs_dir
        self.size = size
        self._items: OrderedDict[str, tuple[RunReader, threading.Lock]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, run_id: str) -> tuple[RunReader, threading.Lock]:
        path = resolve_run_dir(self.runs_dir, run_id)
        with self._lock:
            item = self._items.get(run_id)
            if item is not None and item[0].path == path:
                self._items.move_to_end(run_id)
                return item
            item = (RunReader(path), threading.Lock())
            self._items[run_id] = item
            while len(self._items) > self.size:
                old, _ = self._items.popitem(last=False)[1]
                old.close()
            return item


def page_for(pathname: str, search: str, runs_dir: Path, readers: ReaderCache) -> Any:
    if pathname in ("", "/"):
        return runs.runs_page(runs_dir, runs.list_runs(runs_dir))
    if pathname.startswith("/run/"):
        run_id = pathname[len("/run/"):].strip("/")
        try:
            reader, lock = readers.get(run_id)
        except (InvalidRunId, RunError):
            return html.Div([dcc.Link("← all runs", href="/"), note(f"no run named {run_id!r} in {runs_dir}")],
                            id="not-found")
        rank = parse_qs(search.lstrip("?")).get("rank", ["0"])[0]
        with lock:
            return build_run_page(run_id, reader, int(rank) if rank.isdigit() else 0)
    if pathname == "/compare":
        wanted = [r for r in ",".join(parse_qs(search.lstrip("?")).get("runs", [])).split(",") if r]
        views, missing = [], []
        for run_id in wanted[:8]:
            try:
                reader, lock = readers.get(run_id)
            except (InvalidRunId, RunError):
                missing.append(run_id)
                continue
            with lock:
                view = load_view(reader)
            views.append((str(view.meta.get("name") or run_id), view))
        return compare.compare_page(views, missing)
    return html.Div([dcc.Link("← all runs", href="/"), note(f"no page {pathname}")], id="not-found")


def register_callbacks(app: dash.Dash, runs_dir: Path, readers: ReaderCache) -> None:
    graphs = run_page.LIVE_GRAPHS

    @app.callback(Output("page", "children"), Input("url", "pathname"), Input("url", "search"))
    def route(pathname: str | None, search: str | None) -> Any:
        return page_for(pathname or "/", search or "", runs_dir, readers)

    @app.callback(Output("compare-link", "href"), Input({"type": "compare-pick", "run": ALL}, "value"))
    def compare_href(values: list[list[str]]) -> str:
        picked = [v for vals in values for v in (vals or [])]
        return "/compare?" + urlencode({"runs": ",".join(picked)}) if picked else "/compare"

    @app.callback(
        [Output("live-state", "data"), *(Output(g, "extendData") for g in graphs),
         *(Output(g, "figure", allow_duplicate=True) for g in graphs),
         Output("last-step", "children"), Output("run-status", "children"), Output("run-status", "className"),
         Output("cursor-slider", "max"), Output("cursor-slider", "value", allow_duplicate=True),
         Output("throughput-stats", "children"), Output("stability-lights", "children"),
         Output("events-graph", "figure"), Output("events-table", "data"), Output("live-interval", "max_intervals")],
        Input("live-interval", "n_intervals"),
        State("live-state", "data"), State("cursor-slider", "value"), State("cursor-slider", "max"),
        State("page-run", "data"),
        running=[(Output("live-interval", "disabled"), True, False)],
        prevent_initial_call=True,
    )
    def live(n: int, state: dict[str, Any], cursor: int | None, slider_max: int | None,
             page: dict[str, Any] | None) -> Any:
        if not state or not state.get("run"):
            raise PreventUpdate
        try:
            reader, lock = readers.get(state["run"])
        except (InvalidRunId, RunError):
            raise PreventUpdate from None
        prev_status = state.get("status")
        facts = facts_for(reader.path)  # the one run cache: re-judged as the run grows, so lights move
        with lock:
            phases = {"phases": list(facts.phases)} if facts is not None else None
            res = live_tick(reader, state, lambda g, f: run_page.graph_specs(g, f, int(state.get("rank", 0)), phases))
            view: RunView | None = load_view(reader) if (res.rebuild or res.new_events) else None
        new = res.state
        extends = [res.extends.get(g, no_update) for g in graphs]
        figures: list[Any] = [no_update] * len(graphs)
        if view is not None:
            for i, g in enumerate(graphs):
                if g in res.rebuild:
                    fig, specs = run_page.build_graph(g, view, int(new.get("rank", 0)),
                                                      spikes=list(facts.loss_spike_steps) if facts else None)
                    figures[i] = fig
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
        if res.frames.get("steps") is not None:
            import pandas as pd

            tail = pd.DataFrame({k: v for k, v in (new.get("tails") or {}).get(f"{new.get('rank', 0)}/steps", {}).items()})
            steps = pd.concat([tail, res.frames["steps"]], ignore_index=True)
            stats = [html.Li(t) for t in throughput.stats_lines(throughput.throughput_stats(steps, (page or {}).get("mfu_meta") or {}))]
        lights = stability.lights_row(stability.stability_lights(facts))
        if view is not None:
            ev_fig = events.events_figure(view.frame("events"))
            ev_rows = events.event_rows(view.frame("events"))
        changed = status != prev_status  # the summary panel re-runs the analysis only then
        return [new, *extends, *figures, "-" if last is None else str(last), status if changed else no_update,
                f"status status-{status}" if changed else no_update,
                no_update if last is None else max(last, 1), last if (follow and last is not None) else no_update,
                stats, lights, ev_fig, ev_rows, (n or 0) + 1 if done else no_update]

    @app.callback(Output("play-interval", "disabled"), Output("play-button", "children"),
                  Input("play-button", "n_clicks"), State("play-interval", "disabled"), prevent_initial_call=True)
    def toggle_play(_: int, disabled: bool) -> tuple[bool, str]:
        return (False, "⏸ pause") if disabled else (True, "▶ play")

    @app.callback(
        Output("cursor-slider", "value"),
        Input("play-interval", "n_intervals"), Input("prev-event", "n_clicks"), Input("next-event", "n_clicks"),
        Input("events-graph", "clickData"), Input("events-table", "active_cell"),
        State("cursor-slider", "value"), State("cursor-slider", "min"), State("cursor-slider", "max"),
        State("speed", "value"), State("page-run", "data"), State("events-table", "data"),
        prevent_initial_call=True,
    )
    def move_cursor(_n: int, _p: int, _x: int, click: Any, cell: Any, value: int | None, lo: int, hi: int,
                    speed: int, page: dict[str, Any], rows: list[dict[str, Any]]) -> int:
        trigger = dash.ctx.triggered_id
        value = int(value if value is not None else lo)
        if trigger == "play-interval":
            per_tick = 0.5 * float(speed or 1) / max(float(page.get("step_s") or 0.1), 1e-6)
            nxt = value + max(1, round(per_tick))
            return lo if value >= hi else min(nxt, hi)
        if trigger in ("prev-event", "next-event"):
            steps = [int(r["step"]) for r in rows or [] if r.get("step") is not None]
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
        try:
            reader, lock = readers.get(page["run"])
        except (InvalidRunId, RunError):
            raise PreventUpdate from None
        rank = int(page.get("rank", 0))
        step = int(step)
        prev = prev or {}
        # following a live run: the cursor is the newest step, so no cursor line, and the snapshot and
        # activation views are resent only when a newer one exists
        follow = status == "live" and (slider_max is None or step >= slider_max) and dash.ctx.triggered_id \
            == "cursor-slider"
        with lock:
            rows = memory_row_at(reader, step, rank)
            maps = load_snapshots(reader)
            acts = activations_at(reader, step, rank)
            meta = dict(reader.run_meta(), **(reader.rank_meta().get(rank) or {}))
        snap_key = [len(maps), pick, getattr(pick_snapshot(maps, step, pick), "step", None)]
        act_key = int(acts["step"].max()) if len(acts) else None
        seg_child: Any = no_update
        if not (follow and prev.get("snap") == snap_key):
            seg = segment_map_view(maps, step, pick, meta)
            seg_child = note(seg) if isinstance(seg, str) else \
                dcc.Graph(id="segment-map", figure=seg, config=run_page.GRAPH_CONFIG)
        act_child: Any = no_update
        if len(acts) and not (follow and prev.get("act") == act_key):
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
        try:
            path = resolve_run_dir(runs_dir, page["run"])
        except InvalidRunId:
            raise PreventUpdate from None
        request_snapshot(path)
        return f"requested at {time.strftime('%H:%M:%S')}: it appears after the next step"

    for graph_id, xmode in _ZOOM_GRAPHS.items():
        _register_zoom(app, readers, graph_id, xmode)
    _register_ranks(app, readers)

    @app.callback(Output("summary-panel", "children"), Output("summary-panel", "style"),
                  Input("summary-timer", "n_intervals"), Input("run-status", "children"), State("page-run", "data"),
                  prevent_initial_call=True)
    def summary(_n: int, _status: str | None, page: dict[str, Any] | None) -> tuple[Any, dict[str, str]]:
        # after the first paint (the timer): the analysis reads every row of the run
        if not page:
            raise PreventUpdate
        try:
            path = resolve_run_dir(runs_dir, page["run"])
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
        if not page or (dash.ctx.triggered_id == "live-interval" and (n or 0) % RANKS_EVERY):
            raise PreventUpdate
        try:
            reader, lock = readers.get(page["run"])
        except (InvalidRunId, RunError):
            raise PreventUpdate from None
        with lock:
            reader.refresh()
            if len(reader.ranks) < 2:
                raise PreventUpdate
            view = load_view(reader)
        return ranks.ranks_box(view.frame("steps"), view.frame("memory"))


def zoom_range(relayout: dict[str, Any] | None) -> tuple[float, float] | bool | None:
    """The x range a ``relayoutData`` payload zoomed to; True for a reset; None when x did not change."""
    if not relayout:
        return None
    if relayout.get("xaxis.autorange") or relayout.get("autosize"):
        return True
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        return float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    rng = relayout.get("xaxis.range")
    if isinstance(rng, list) and len(rng) == 2:
        return float(rng[0]), float(rng[1])
    return None


def _register_zoom(app: dash.Dash, readers: ReaderCache, graph_id: str, xmode: str) -> None:
    @app.callback(Output(graph_id, "figure", allow_duplicate=True), Input(graph_id, "relayoutData"),
                  State("live-state", "data"), State("cursor-slider", "value"), prevent_initial_call=True)
    def requery(relayout: dict[str, Any] | None, state: dict[str, Any], cursor: int | None) -> Any:
        rng = zoom_range(relayout)
        if rng is None or not state or not state.get("downsampled"):
            raise PreventUpdate
        try:
            reader, lock = readers.get(state["run"])
        except (InvalidRunId, RunError):
            raise PreventUpdate from None
        with lock:
            view = load_view(reader)
            if isinstance(rng, tuple):
                view = range_view(reader, view, rng[0], rng[1], xmode)
        facts = facts_for(reader.path)
        fig, _ = run_page.build_graph(graph_id, view, int(state.get("rank", 0)), cursor,
                                      spikes=list(facts.loss_spike_steps) if facts is not None else None)
        if isinstance(rng, tuple):
            fig.update_xaxes(range=list(rng))
        return fig
