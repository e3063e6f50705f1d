"""Callbacks of the allocator snapshot views: the allocation timeline (a zoom draws its window again; another
snapshot shown draws it anew), an imported snapshot's page (the snapshot picked and the one compared with) and
the run page's snapshot diff.

Each callback's body is a pure function of the browser's payload and the run's readers; the views are
:mod:`gpudash.server.layouts.snapshot_views`' and :mod:`gpudash.server.layouts.snapshot_page`'s."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, no_update
from dash.exceptions import PreventUpdate
from gpudash.server.layouts.inputs import BadInput, as_int, page_run
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.snapshot_diff_view import diff_children, largest_children
from gpudash.server.layouts.snapshot_page import pick_pair, snapshot_parts
from gpudash.server.layouts.snapshot_views import (
    alloc_timeline_child,
    alloc_timeline_figure,
    alloc_timeline_view,
    load_snapshots,
    map_key,
    pick_snapshot,
    shown_map,
    zoom_window,
)
from gpudash.server.layouts.viewstate import ZOOM_JS

__all__ = ["alloc_timeline_box", "alloc_timeline_zoom", "register_snapshot_callbacks", "run_page_diff",
           "snapshot_pick"]


def _maps(readers: ReaderCache, page: Any) -> list[Any]:
    reader, lock = readers.get_or_skip(page_run(page)[0])
    with lock:
        return load_snapshots(reader)


def alloc_timeline_zoom(relayout: Any, key: Any, page: Any, *, readers: ReaderCache) -> Any:
    """The allocation timeline drawn again for the window a zoom shows, from every event in it (as the long
    step charts re-query); ``key``: the ``alloc-timeline-key`` of the snapshot it shows."""
    window = zoom_window(relayout)
    if window is None or not page:
        raise PreventUpdate
    mm = shown_map(_maps(readers, page), key)
    if mm is None:
        raise PreventUpdate
    return alloc_timeline_figure(mm, window=None if window is True else window)  # type: ignore[arg-type]


def alloc_timeline_box(step: Any, pick: Any, page: Any, shown: Any, *, readers: ReaderCache) -> tuple[Any, Any]:
    """The allocation timeline and its key, drawn only when another snapshot is chosen (the cursor passing
    one, or the picker); ``shown``: the key of the one drawn."""
    if step is None or not page:
        raise PreventUpdate
    step = as_int(step, "cursor")
    if not isinstance(pick, str | None):
        raise BadInput("snapshot pick must be a string")
    maps = _maps(readers, page)
    key = map_key(maps, pick_snapshot(maps, step, pick))
    if key == shown:
        raise PreventUpdate
    return alloc_timeline_child(alloc_timeline_view(maps, step, pick)), key


def snapshot_pick(pick: Any, diff_pick: Any, page: Any, shown_key: Any, *, readers: ReaderCache,
                  graph_config: Any = None) -> tuple[Any, ...]:
    """An imported snapshot's page: the segment map, largest allocations, timeline, its key and the diff for
    the snapshot picked and the one compared with; only the diff when the snapshot shown stays."""
    if not page:
        raise PreventUpdate
    maps = _maps(readers, page)
    shown, before = pick_pair(maps, pick, diff_pick)
    parts = snapshot_parts(maps, shown, before, graph_config)
    if parts["key"] == shown_key:  # only the comparison changed: the views keep what they show
        return no_update, no_update, no_update, no_update, parts["diff"]
    return parts["segment"], parts["largest"], parts["timeline"], parts["key"], parts["diff"]


def run_page_diff(diff_pick: Any, pick: Any, step: Any, page: Any, *, readers: ReaderCache,
                  graph_config: Any = None) -> tuple[Any, Any]:
    """The run page's snapshot diff and largest allocations: B is the snapshot its views show (picker or
    cursor), A the one picked to compare with."""
    if not page:
        raise PreventUpdate
    step = None if step is None else as_int(step, "cursor")
    maps = _maps(readers, page)
    if not isinstance(pick, str | None):
        raise BadInput("snapshot pick must be a string")
    shown = pick_snapshot(maps, step, pick)
    _, before = pick_pair(maps, None, diff_pick)
    return diff_children(maps, before, shown, graph_config) if before is not None else [], largest_children(shown)


def register_snapshot_callbacks(app: dash.Dash, readers: ReaderCache) -> None:
    """The snapshot views' callbacks, on the run page and an imported snapshot's page."""
    from gpudash.server.layouts.run_page import GRAPH_CONFIG

    # a chart's own {"autosize": true} right after its first draw would re-fire a zoom in flight and Dash would
    # drop the zoom's answer: only x-range changes reach the server, through alloc-timeline-zoom (ZOOM_JS)
    app.clientside_callback(ZOOM_JS, Output("alloc-timeline-zoom", "data"), Input("alloc-timeline", "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(Output("alloc-timeline", "figure"), Input("alloc-timeline-zoom", "data"),
                  State("alloc-timeline-key", "data"), State("page-run", "data"), prevent_initial_call=True)
    def timeline_zoom(relayout: Any, key: Any, page: Any) -> Any:
        return alloc_timeline_zoom(relayout, key, page, readers=readers)

    @app.callback(Output("alloc-timeline-box", "children"), Output("alloc-timeline-key", "data"),
                  Input("cursor-slider", "value"), Input("snapshot-pick", "value"), State("page-run", "data"),
                  State("alloc-timeline-key", "data"), prevent_initial_call=True)
    def timeline(step: Any, pick: Any, page: Any, shown: Any) -> tuple[Any, Any]:
        return alloc_timeline_box(step, pick, page, shown, readers=readers)

    @app.callback(Output("segment-map-box", "children", allow_duplicate=True), Output("largest-box", "children"),
                  Output("alloc-timeline-box", "children", allow_duplicate=True),
                  Output("alloc-timeline-key", "data", allow_duplicate=True), Output("snapshot-diff-box", "children"),
                  Input("snap-pick", "value"), Input("snap-diff-pick", "value"), State("page-run", "data"),
                  State("alloc-timeline-key", "data"), prevent_initial_call=True)
    def picked(pick: Any, diff_pick: Any, page: Any, shown_key: Any) -> tuple[Any, ...]:
        return snapshot_pick(pick, diff_pick, page, shown_key, readers=readers, graph_config=GRAPH_CONFIG)

    @app.callback(Output("snapshot-diff-box", "children", allow_duplicate=True),
                  Output("largest-box", "children", allow_duplicate=True),
                  Input("snapshot-diff-pick", "value"), Input("snapshot-pick", "value"), Input("cursor-slider", "value"),
                  State("page-run", "data"), prevent_initial_call=True)
    def diff(diff_pick: Any, pick: Any, step: Any, page: Any) -> tuple[Any, Any]:
        return run_page_diff(diff_pick, pick, step, page, readers=readers, graph_config=GRAPH_CONFIG)
