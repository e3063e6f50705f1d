"""Callbacks of the run page's replay bar: play / pause, the cursor moved (played, typed, to the previous or
next event, to an event clicked), the views at the cursor (memory breakdown, segment map, activations, the
cursor line) and the "take a snapshot" button.

Each callback's body is a pure function of the browser's payload (the input that fired passed in as
``trigger``, not read from Dash's context) and the run's readers."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import dash
from dash import Input, Output, Patch, State, dcc, no_update
from dash.exceptions import PreventUpdate
from gpudash.server.layouts import events, memory, run_page
from gpudash.server.layouts.common import note
from gpudash.server.layouts.inputs import BadInput, as_float, as_int, page_run
from gpudash.server.layouts.pages import (
    activations_at,
    load_snapshots,
    memory_row_at,
    pick_snapshot,
    request_snapshot,
    segment_map_view,
)
from gpudash.server.layouts.readers import ReaderCache

__all__ = ["SnapshotRequests", "event_inputs", "follow_cursor", "move_cursor", "register_replay_callbacks",
           "snapshot_now", "toggle_play"]


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
        try:
            request_snapshot(run_dir)
        except OSError as exc:  # a link planted in its place (never written through), a read-only folder
            return f"not requested: {str(exc)[:200]}"
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


def toggle_play(disabled: Any) -> tuple[bool, str]:
    """The play button: the replay interval's ``disabled`` and the button's label."""
    return (False, "⏸ pause") if disabled else (True, "▶ play")


def move_cursor(trigger: Any, click: Any, cell: Any, value: Any, lo: Any, hi: Any, speed: Any, page: Any, rows: Any,
                typed: Any) -> int:
    """The cursor's new step. ``trigger``: the input that fired (``play-interval``, ``prev-event`` /
    ``next-event``, ``events-graph``, ``events-table``, ``cursor-input``); then the events click and table
    cell, and the states: the slider's value, min and max, the speed, ``page-run``, ``events-rows`` and the
    step typed into the step box."""
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


def _cursor_line(step: int, visible: bool) -> Patch:
    p = Patch()
    p["layout"]["shapes"][0]["x0"] = step
    p["layout"]["shapes"][0]["x1"] = step
    p["layout"]["shapes"][0]["visible"] = visible
    return p


def follow_cursor(step: Any, pick: Any, page: Any, slider_max: Any, status: Any, prev: Any, *,
                  trigger: Any, readers: ReaderCache) -> list[Any]:
    """The views at the cursor: its label, the memory breakdown, the segment map, the activations, the
    ``cursor-follow`` store and a cursor-line patch for each of ``run_page.CURSOR_GRAPHS``. Inputs: the
    slider's value and the snapshot picked; states: ``page-run``, the slider's max, the run's status and the
    last ``cursor-follow``; ``trigger``: the input that fired."""
    if step is None or not page:
        raise PreventUpdate
    run_id, rank = page_run(page)
    step = as_int(step, "cursor")
    slider_max = None if slider_max is None else as_int(slider_max, "slider max")
    if not isinstance(pick, str | None) or not isinstance(status, str | None) or not isinstance(prev, dict | None):
        raise BadInput("snapshot pick, status and cursor-follow must be strings and an object")
    reader, lock = readers.get_or_skip(run_id)
    prev = prev or {}
    # following a live run: the cursor is the newest step, so no cursor line, and the snapshot and
    # activation views are resent only when a newer one exists
    follow = status == "live" and (slider_max is None or step >= slider_max) and trigger == "cursor-slider"
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
    patches = [no_update if follow and prev.get("follow") else _cursor_line(step, not follow)
               for _ in run_page.CURSOR_GRAPHS]
    state = {"follow": follow, "snap": snap_key, "act": act_key}
    return [str(step), memory.memory_at_figure(memory.memory_at(rows, step, rank)), seg_child, act_child, state,
            *patches]


def snapshot_now(page: Any, *, readers: ReaderCache, requests: SnapshotRequests) -> str:
    """The "take a snapshot" button's answer (``page-run`` in): asked of a live run, at most every few seconds."""
    if not page:
        raise PreventUpdate
    run_id, _ = page_run(page)
    reader, lock = readers.get_or_skip(run_id)
    with lock:
        status = reader.status()
    return requests.ask(run_id, reader.path, status)


def register_replay_callbacks(app: dash.Dash, readers: ReaderCache) -> None:
    """The replay bar's callbacks: :func:`toggle_play`, :func:`move_cursor`, :func:`follow_cursor` and
    :func:`snapshot_now` (one :class:`SnapshotRequests` for the app)."""
    requests = SnapshotRequests()

    @app.callback(Output("play-interval", "disabled"), Output("play-button", "children"),
                  Input("play-button", "n_clicks"), State("play-interval", "disabled"), prevent_initial_call=True)
    def play(_: Any, disabled: Any) -> tuple[bool, str]:
        return toggle_play(disabled)

    @app.callback(
        Output("cursor-slider", "value"),
        Input("play-interval", "n_intervals"), Input("prev-event", "n_clicks"), Input("next-event", "n_clicks"),
        Input("events-graph", "clickData"), Input("events-table", "active_cell", allow_optional=True),
        Input("cursor-input", "n_submit"),
        State("cursor-slider", "value"), State("cursor-slider", "min"), State("cursor-slider", "max"),
        State("speed", "value"), State("page-run", "data"), State("events-rows", "data"), State("cursor-input", "value"),
        prevent_initial_call=True,
    )
    def cursor(_n: Any, _p: Any, _x: Any, click: Any, cell: Any, _enter: Any, value: Any, lo: Any, hi: Any,
               speed: Any, page: Any, rows: Any, typed: Any) -> int:
        return move_cursor(dash.ctx.triggered_id, click, cell, value, lo, hi, speed, page, rows, typed)

    @app.callback(
        [Output("cursor-label", "children"), Output("memory-at-graph", "figure"), Output("segment-map-box", "children"),
         Output("activations-box", "children"), Output("cursor-follow", "data"),
         *(Output(g, "figure", allow_duplicate=True) for g in run_page.CURSOR_GRAPHS)],
        Input("cursor-slider", "value"), Input("snapshot-pick", "value"), State("page-run", "data"),
        State("cursor-slider", "max"), State("run-status", "children"), State("cursor-follow", "data"),
        prevent_initial_call=True,
    )
    def at_cursor(step: Any, pick: Any, page: Any, slider_max: Any, status: Any, prev: Any) -> list[Any]:
        return follow_cursor(step, pick, page, slider_max, status, prev, trigger=dash.ctx.triggered_id,
                             readers=readers)

    @app.callback(Output("snapshot-requested", "children"), Input("snapshot-request", "n_clicks"),
                  State("page-run", "data"), prevent_initial_call=True)
    def snapshot(_n: Any, page: Any) -> str:
        return snapshot_now(page, readers=readers, requests=requests)
