"""Snapshot views of the run page: which snapshot is shown, and the allocation timeline.

The timeline is :func:`gpudash.analysis.snapshot_trace.allocation_timeline` drawn: each allocation band
as bars (one per stretch where its lower edge holds still; its size, life and a few frames on hover; all the
bands in one bar trace, drawn fast), the merged smaller
allocations as one grey band on top, and a line of text that says what was merged, what was
alive before the trace began and what the trace does not hold. The segment map is
:func:`gpudash.server.layouts.memory.segment_map_figure`. Both follow the snapshot picker and the cursor.
"""

from __future__ import annotations

import math
from typing import Any

from dash import dcc, html
from gpudash.analysis.snapshot_trace import AllocTimeline, Band, TraceModel, allocation_timeline, trace_model
from gpudash.server.layouts import memory
from gpudash.server.layouts.common import (
    base_figure,
    byte_unit,
    note,
    plot_text,
    source_reason,
    unit_axis,
    waiting_figure,
)
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.inputs import as_float
from gpudash.server.layouts.viewstate import relayout_range
from gpudash.store.reader import RunReader
from gpudash.units import fmt_duration, human_bytes

__all__ = ["alloc_timeline_child", "alloc_timeline_figure", "alloc_timeline_view", "load_snapshots", "map_key",
           "pick_snapshot", "segment_map_view", "shown_map", "snapshot_options",
           "timeline_of", "zoom_window"]

_BAND_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
                "#bab0ac"]
_BASE_COLORS = ["#8c8c8c", "#a5a5a5"]
_MERGED = "rgba(150,150,150,0.55)"
_NO_FRAMES = "no Python frames (allocated from C++, e.g. in autograd's backward)"
_NO_TRACE = ("this snapshot holds no allocation history: call torch.cuda.memory._record_memory_history() "
             "before the snapshot (gpudash's snapshot_every does)")

_SNAP_CACHE: dict[tuple[str, int], list[Any]] = {}
_TIMELINES: dict[int, tuple[Any, TraceModel | None, AllocTimeline | None]] = {}
#: the whole trace's figure per map (every visit of the page sends the same one; a zoom builds its own)
_FIGURES: dict[int, tuple[Any, Fig]] = {}


def load_snapshots(reader: RunReader, problems: list[str] | None = None) -> list[Any]:
    """MemoryMap objects of the run's allocator snapshots ([] if none or the parser is missing).

    Decoded once per run and snapshot count: the cursor asks for them on every move."""
    key = (str(reader.path.resolve()), sum(r.max_rowid("snapshots") for r in reader.ranks.values()))
    if key in _SNAP_CACHE:
        return _SNAP_CACHE[key]
    maps = _decode_snapshots(reader, problems)
    if len(_SNAP_CACHE) > 16:
        _SNAP_CACHE.clear()
    _SNAP_CACHE[key] = maps
    return maps


def _decode_snapshots(reader: RunReader, problems: list[str] | None) -> list[Any]:
    frame = reader.read_table("snapshots")
    if not len(frame):
        return []
    from gpudash.store.snapshot import snapshots_from_frame  # loaded at the first run that has snapshots

    try:
        return list(snapshots_from_frame(frame, problems if problems is not None else []))
    except MemoryError:
        if problems is not None:
            problems.append("snapshots unreadable: too large for the memory this server has")
        return []
    except Exception as exc:  # noqa: BLE001 - a bad snapshot must not break the page
        if problems is not None:
            problems.append(f"snapshots unreadable: {str(exc)[:200] or type(exc).__name__}")
        return []


def snapshot_options(maps: list[Any]) -> list[dict[str, Any]]:
    opts: list[dict[str, Any]] = [{"label": "snapshot at the cursor", "value": "cursor"}]
    for i, mm in enumerate(maps):
        step = getattr(mm, "step", None)
        reason = getattr(mm, "reason", None) or ""
        opts.append({"label": f"step {step} {reason}".strip(), "value": str(i)})
    return opts


def pick_snapshot(maps: list[Any], step: int | None, choice: str | None = "cursor") -> Any | None:
    """The chosen snapshot, or the last one taken at or before ``step`` (else the first)."""
    if not maps:
        return None
    if choice and choice != "cursor":
        try:
            return maps[int(choice)]
        except (ValueError, IndexError):
            pass
    if step is None:
        return maps[-1]
    before = [m for m in maps if getattr(m, "step", None) is not None and int(m.step) <= step]
    return before[-1] if before else maps[0]


def segment_map_view(maps: list[Any], step: int | None, choice: str | None, meta: dict[str, Any],
                     ev: Any = None) -> Fig | str:
    mm = pick_snapshot(maps, step, choice)
    if mm is None:
        return source_reason("snapshots", meta, ev) + " (no snapshot recorded; snapshot_every or an OOM takes one)"
    return memory.segment_map_figure(mm)


def timeline_of(mm: Any, window: tuple[float, float] | None = None) -> AllocTimeline | None:
    """The allocation timeline of a memory map (the whole trace, or the x range ``window`` at full detail);
    its allocations are worked out once per map (maps are cached per run), a window from them in milliseconds."""
    hit = _TIMELINES.get(id(mm))
    if hit is None or hit[0] is not mm:
        model = trace_model(mm)
        hit = (mm, model, allocation_timeline(mm, model=model) if model is not None else None)
        if len(_TIMELINES) >= 8:
            _TIMELINES.clear()
        _TIMELINES[id(mm)] = hit  # the map is held, so its id is not reused while cached
    if window is None or hit[1] is None:
        return hit[2]
    return allocation_timeline(mm, model=hit[1], window=window)


def _snapshot_title(mm: Any) -> str:
    step = getattr(mm, "step", None)
    reason = getattr(mm, "reason", None)
    return (f" (step {plot_text(step)})" if step is not None else "") + (f" - {plot_text(reason)}" if reason else "")


def _band_hover(b: Band, t0_us: float) -> str:
    life = "alive before the trace began" if b.base else f"allocated at event {b.start}"
    if not b.base and math.isfinite(b.alloc_us) and math.isfinite(t0_us):
        life += f" (+{fmt_duration((b.alloc_us - t0_us) / 1e6)})"
    if math.isfinite(b.free_us):
        life += f", freed at event {b.end}"
        if not b.base and math.isfinite(b.alloc_us):
            life += f" ({fmt_duration((b.free_us - b.alloc_us) / 1e6)} later)"
    else:
        life += ", still allocated at the snapshot"
    frames = [plot_text(f, 160) for f in b.stack.split("\n") if f] or [_NO_FRAMES]
    if b.stack_of_free and b.stack:
        frames.insert(0, "freed by:")
    return f"{human_bytes(b.size)} at {b.address:#x}<br>{life}<br>" + "<br>".join(frames)


def _notes(tl: AllocTimeline) -> list[str]:
    """What the chart leaves out or starts from, one line each: bands drawn and merged; the base layer and
    what the trace does not hold."""
    first = [f"{len(tl.bands):,} of {tl.allocations:,} allocations drawn as bands"]
    if tl.window is not None:
        first.append(f"{tl.in_window:,} alive in this window")
    if tl.merged:
        first.append(f"{tl.merged:,} smaller allocations merged (grey band on top; zoom in for detail)")
    second = []
    if tl.base:
        second.append(f"{tl.base:,} alive before the trace began (grey, at the bottom)")
    if tl.truncated:
        second.append(f"trace truncated: its oldest {tl.truncated:,} entries were not stored")
    elif tl.freed_before:
        second.append(f"the trace begins mid-run ({tl.freed_before:,} frees of older allocations; the allocator "
                      "keeps only its last max_entries events)")
    return [" · ".join(first)] + ([" · ".join(second)] if second else [])


def _band_bars(tl: AllocTimeline, scale: float, t0: float) -> dict[str, Any]:
    """Every band as one bar trace: a bar per stretch of the band's life where its lower edge holds still
    (``Band.xs`` and ``lows``), its hover the band's size, life and frames. One trace, not a polygon trace
    per band: Plotly's cost is per trace (defaults, calc and drawing: ~1 ms each on a free core), and the
    200 band traces were most of the page's first draw. A bar's hover is its own (a filled polygon's hover
    is its trace's), so the frames under the pointer are the band's under it."""
    xs: list[float] = []
    widths: list[int] = []
    bases: list[float] = []
    heights: list[float] = []
    colors: list[str] = []
    hovers: list[str] = []
    for i, b in enumerate(tl.bands):
        color = _BASE_COLORS[i % 2] if b.base else _BAND_COLORS[i % len(_BAND_COLORS)]
        hover = _band_hover(b, t0)
        for x0, x1, low in zip(b.xs, [*b.xs[1:], b.end], b.lows, strict=True):
            if x1 > x0:
                xs.append((x0 + x1) / 2)
                widths.append(x1 - x0)
                bases.append(low / scale)
                heights.append(b.size / scale)
                colors.append(color)
                hovers.append(hover)
    # opaque bars without an outline: Plotly widens any thinner than a pixel to one, so none vanishes
    return {"type": "bar", "x": xs, "width": widths, "base": bases, "y": heights,
            "marker": {"color": colors, "line": {"width": 0}}, "hovertext": hovers, "hoverinfo": "text",
            "textposition": "none", "name": "allocations"}


def alloc_timeline_figure(mm: Any, tl: AllocTimeline | None = None, window: tuple[float, float] | None = None) -> Fig:
    """memory_viz's Active Memory Timeline: every allocation a band over the trace's events, stacked;
    when one is freed the bands above it drop down, so the top is the live bytes. ``window``: the x range
    zoomed to (drawn again from every event in it; double-click shows the whole trace). The whole trace's
    figure (no ``tl``, no ``window``) is built once per map."""
    if tl is None and window is None:
        hit = _FIGURES.get(id(mm))
        if hit is not None and hit[0] is mm:
            return hit[1]
        fig = _alloc_timeline_figure(mm, timeline_of(mm), None)
        if len(_FIGURES) >= 8:
            _FIGURES.clear()
        _FIGURES[id(mm)] = (mm, fig)  # the map is held, so its id is not reused while cached
        return fig
    return _alloc_timeline_figure(mm, tl if tl is not None else timeline_of(mm, window), window)


def _alloc_timeline_figure(mm: Any, tl: AllocTimeline | None, window: tuple[float, float] | None) -> Fig:
    title = "Allocation timeline" + _snapshot_title(mm)
    if tl is None:
        fig = base_figure(title, height=420, xaxis_title="allocation event", yaxis_title="live bytes")
        return waiting_figure(fig, _NO_TRACE)
    unit, scale = byte_unit(float(tl.peak_bytes) or None)
    if tl.window is None:
        title += f": peak {human_bytes(tl.peak_bytes)} at event {tl.peak_x:,} of {tl.events:,}"
    else:
        title += (f": events {tl.window[0]:,}-{tl.window[1]:,} of {tl.events:,} (peak here {human_bytes(tl.peak_bytes)} "
                  f"at {tl.peak_x:,})")
    fig = base_figure(title, height=460, xaxis_title="allocation event (each alloc or free is one step)",
                      yaxis_title="live bytes", bytes_axis=unit)
    # fixed margins (room for "18.8 GiB" ticks and the axis titles), no automargin: Plotly draws a figure whose
    # margins it grows twice, and with a band per allocation the second draw was ~60% of the first paint
    fig.update_layout(hovermode="closest", showlegend=False, margin={"l": 84, "r": 30, "t": 76, "b": 52},
                      barmode="overlay")
    t0 = float(tl.time_us[0]) if len(tl.time_us) else float("nan")
    fig.add_trace(_band_bars(tl, scale, t0))
    x = [int(v) for v in tl.x]
    fig.add_trace({"type": "scatter", "mode": "lines", "x": x, "y": [v / scale for v in tl.drawn],
                   "line": {"width": 0, "shape": "hv"}, "hoverinfo": "skip", "name": "drawn bands"})
    merged_text = [f"{tl.merged:,} smaller allocations: {human_bytes(float(t - d))}<br>live in all: {human_bytes(float(t))}"
                   for d, t in zip(tl.drawn, tl.total, strict=True)]
    fig.add_trace({"type": "scatter", "mode": "lines", "x": x, "y": [v / scale for v in tl.total], "fill": "tonexty",
                   "fillcolor": _MERGED, "line": {"width": 0.8, "color": "#777", "shape": "hv"},
                   "text": merged_text, "hoverinfo": "text+x", "name": "smaller allocations (merged)"})
    fig.add_annotation(text="<br>".join(plot_text(line, 300) for line in _notes(tl)), showarrow=False, xref="paper", yref="paper", x=0, y=1.0,
                       xanchor="left", yanchor="bottom", align="left", font={"size": 11, "color": "#666"})
    fig.update_xaxes(range=[0, tl.events + 1] if window is None else [float(min(window)), float(max(window))],
                     tickformat=",d", automargin=False)
    fig.layout["meta"] = {"events": tl.events, "window": list(tl.window) if tl.window else None,
                          "bands": len(tl.bands), "sampled": len(tl.x)}
    fig.update_yaxes(**unit_axis(unit), rangemode="tozero", automargin=False)
    return fig


def alloc_timeline_view(maps: list[Any], step: int | None, choice: str | None) -> Fig | str:
    mm = pick_snapshot(maps, step, choice)
    if mm is None:
        return "allocation timeline: no snapshot recorded (snapshot_every, an OOM or gpudash import-snapshot adds one)"
    if timeline_of(mm) is None:
        return "allocation timeline: " + _NO_TRACE
    return alloc_timeline_figure(mm)


def map_key(maps: list[Any], mm: Any) -> list[Any]:
    """What the page keeps of the snapshot the timeline shows: the number of maps and its index."""
    return [len(maps), next((i for i, m in enumerate(maps) if m is mm), None)]


def alloc_timeline_child(view: Fig | str) -> Any:
    from gpudash.server.layouts.run_page import GRAPH_CONFIG

    if isinstance(view, str):
        return note(view)
    # the zoom store beside its graph: both replaced together when another snapshot is shown
    return html.Div([dcc.Graph(id="alloc-timeline", figure=view, config=GRAPH_CONFIG, className="graph"),
                     dcc.Store(id="alloc-timeline-zoom")])


def zoom_window(relayout: Any) -> tuple[float, float] | bool | None:
    """The event range a ``relayoutData`` of the timeline zoomed to; True for a reset, None for no x change."""
    rng = relayout_range(relayout)
    if isinstance(rng, tuple):
        return as_float(rng[0], "x range"), as_float(rng[1], "x range")
    return rng


def shown_map(maps: list[Any], key: Any) -> Any | None:
    """The map the timeline shows (its key: ``[number of maps, index]``), None if the run changed since."""
    if not (isinstance(key, list) and len(key) == 2 and key[0] == len(maps) and isinstance(key[1], int)
            and 0 <= key[1] < len(maps)):
        return None
    return maps[key[1]]
