"""The page of a run that holds only allocator snapshots (``gpudash import-snapshot``; no steps, no memory
records): its snapshots and nothing empty. A snapshot picker; the segment map beside the largest live
allocations with their frames; the allocation timeline of the whole trace (zoom re-draws the window from
every event in it); and the snapshot diff against another snapshot of the run.

The step charts, replay bar, costs and verdicts of a training run are left out: there is nothing in them."""

from __future__ import annotations

from typing import Any

from dash import dcc, html
from gpudash.server.layouts import memory
from gpudash.server.layouts.common import note
from gpudash.server.layouts.data import RunView
from gpudash.server.layouts.inputs import BadInput
from gpudash.server.layouts.links import href
from gpudash.server.layouts.snapshot_diff_view import diff_children, diff_options, largest_children
from gpudash.server.layouts.snapshot_views import (
    alloc_timeline_child,
    alloc_timeline_view,
    map_key,
    snapshot_options,
)

__all__ = ["is_snapshot_only", "pick_pair", "snapshot_page", "snapshot_parts"]


def is_snapshot_only(view: RunView, maps: list[Any]) -> bool:
    """A finished run with snapshots and no steps, memory records or events (an imported snapshot). A training
    run that died before its first step (a CUDA OOM in step 0, recorded on an H200) has its events (the OOM, the
    pre-flight) and gets the run page: the cause of death beside the snapshot taken at it."""
    return (bool(maps) and view.status != "live" and not len(view.frame("steps")) and not len(view.frame("memory"))
            and not len(view.frame("events")))


def pick_pair(maps: list[Any], pick: Any, diff_pick: Any) -> tuple[Any | None, Any | None]:
    """(the snapshot shown, the one it is compared with) from the two pickers' values ("cursor"/"none": the
    newest shown, no comparison)."""
    if not isinstance(pick, str | None) or not isinstance(diff_pick, str | None):
        raise BadInput("snapshot picks must be strings")

    def at(value: str | None) -> Any | None:
        try:
            i = int(value) if value is not None else -1
        except ValueError:
            return None
        return maps[i] if 0 <= i < len(maps) else None

    shown = at(pick) or (maps[-1] if maps else None)
    return shown, at(diff_pick)


def snapshot_parts(maps: list[Any], shown: Any, before: Any, graph_config: Any) -> dict[str, Any]:
    """Children of each box of the snapshot views for the snapshot ``shown`` (and ``before`` to compare)."""
    seg = memory.segment_map_figure(shown) if shown is not None else None
    return {
        "segment": dcc.Graph(id="segment-map", figure=seg, config=graph_config) if seg is not None
        else note("no snapshot"),
        "largest": largest_children(shown),
        "timeline": alloc_timeline_child(alloc_timeline_view([shown], None, "0")) if shown is not None else None,
        "key": map_key(maps, shown),
        "diff": diff_children(maps, before, shown, graph_config),
    }


def snapshot_page(run_id: str, view: RunView, maps: list[Any], graph_config: Any) -> html.Div:
    meta = view.meta
    last = len(maps) - 1
    parts = snapshot_parts(maps, maps[-1], None, graph_config)
    source = meta.get("imported_from")
    header = html.Div([
        html.Div([dcc.Link("← all runs", href=href("/")), html.H2(str(meta.get("name") or run_id), id="run-name")]),
        html.Div([html.Span("snapshots", id="run-status", className="status status-finished"),
                  html.Span(f" {len(maps)} allocator snapshot{'s' if len(maps) != 1 else ''}"
                            + (f", imported from {source}" if source else ""), className="muted")]),
        html.Div([note(p) for p in view.problems], id="run-problems"),
    ], className="run-header", id="run-header")
    pickers = html.Div([
        dcc.Dropdown(id="snap-pick", options=snapshot_options(maps)[1:], value=str(last), clearable=False,
                     style={"flex": "1"}),
        dcc.Dropdown(id="snap-diff-pick", options=diff_options(maps), value="none", clearable=False,
                     style={"flex": "1"}),
    ], style={"display": "flex", "gap": "8px", "alignItems": "center"})
    body = html.Details([
        html.Summary(html.H3("Allocator snapshot")), pickers,
        html.Div([html.Div(parts["segment"], id="segment-map-box", className="half"),
                  html.Div(parts["largest"], id="largest-box", className="half")], className="row"),
        html.Div(parts["timeline"], id="alloc-timeline-box"),
        dcc.Store(id="alloc-timeline-key", data=parts["key"]),
        html.Div(parts["diff"], id="snapshot-diff-box"),
    ], id="snapshot-view", className="view", open=True)
    return html.Div([header, body, dcc.Store(id="page-run", data={"run": run_id, "rank": 0, "snapshot_only": True})],
                    id="run-page", className="snapshot-page")
