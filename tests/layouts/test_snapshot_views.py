"""Snapshot views on the real allocator snapshot: the segment map's totals over every segment, the
allocation timeline's figure, and both on the run page of an imported snapshot."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

from helpers.components import find

from gpudash.cli import main as cli
from gpudash.server.layouts import memory, snapshot_views
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.pages import build_run_page
from gpudash.store.reader import RunReader
from gpudash.store.snapshot import load_snapshot, memory_map_from_summary, summarize
from gpudash.units import human_bytes

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"


def _raw() -> dict[str, Any]:
    return pickle.loads(REAL.read_bytes())  # our own fixture: trusted


def _texts(fig: Fig) -> str:
    return " | ".join(str(a.text) for a in fig.layout.annotations)


def test_segment_map_totals_are_over_every_segment() -> None:
    raw = _raw()
    free = sum(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "inactive")
    reserved = sum(s["total_size"] for s in raw["segments"])
    largest = max(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "inactive")
    fig = memory.segment_map_figure(load_snapshot(REAL))
    text = _texts(fig)
    assert f"free in all 216: {human_bytes(free)} of {human_bytes(reserved)} reserved" in text
    assert f"largest free block {human_bytes(largest)}" in text
    assert "showing the 60 largest of 216 segments" in text
    assert len({y for t in fig.data for y in t.y}) == 60
    every = memory.segment_map_figure(load_snapshot(REAL), max_segments=500)
    assert "all 216 segments" in _texts(every) and len({y for t in every.data for y in t.y}) == 216


def test_alloc_timeline_figure_of_the_real_snapshot() -> None:
    mm = load_snapshot(REAL)
    tl = snapshot_views.timeline_of(mm)
    assert tl is not None and snapshot_views.timeline_of(mm) is tl  # computed once per map
    fig = snapshot_views.alloc_timeline_figure(mm)
    assert snapshot_views.alloc_timeline_figure(mm) is fig  # the whole trace's figure: built once per map
    bars = fig.data[0]  # every band in one bar trace (a trace per band made the first draw slow)
    assert bars.type == "bar" and len(fig.data) == 3
    # a bar per stretch of each band where its lower edge holds still, each with the band's hover
    assert len(set(bars.hovertext)) == len(tl.bands) <= 200
    assert sum(len(t.x) for t in fig.data) <= 20_000
    # the bars tile each band: its bars' widths add up to its life, each bar inside it at one of its lower edges
    for b in tl.bands:
        hover = snapshot_views._band_hover(b, float(tl.time_us[0]))
        mine = [i for i, h in enumerate(bars.hovertext) if h == hover]
        assert sum(bars.width[i] for i in mine) == b.end - b.start
        assert all(b.start <= bars.x[i] < b.end and bars.y[i] * 2**30 == b.size
                   and bars.base[i] * 2**30 == b.low_at(int(bars.x[i] - bars.width[i] / 2)) for i in mine)
    hovers = list(set(bars.hovertext))
    assert any("cs336_basics\\model.py:" in h and " forward" in h for h in hovers)  # frames on hover
    assert any("alive before the trace began" in h for h in hovers)
    assert any("freed by:<br>" in h for h in hovers)  # older allocations freed in the trace: the free's frames
    assert any("no Python frames" in h for h in hovers)  # autograd's backward allocations
    assert all(re.match(r"[\d.]+ [KMG]iB at 0x", h) for h in hovers)  # binary units
    text = _texts(fig)
    assert f"the trace begins mid-run ({tl.freed_before:,} frees of older allocations" in text
    assert f"{tl.merged:,} smaller allocations merged" in text and f"{tl.base:,} alive before the trace" in text
    assert fig.layout["yaxis"]["ticksuffix"] == " GiB"
    assert f"peak {human_bytes(tl.peak_bytes)}" in fig.layout["title"]["text"]
    # the top of the stack is the live bytes: the merged band's upper edge, in GiB
    assert max(fig.data[-1].y) * 2**30 == tl.total.max()


def test_a_truncated_trace_says_so() -> None:
    mm = load_snapshot(REAL)
    mm.truncated_trace = 1234
    fig = snapshot_views.alloc_timeline_figure(mm, snapshot_views.allocation_timeline(mm))
    assert "trace truncated: its oldest 1,234 entries were not stored" in _texts(fig)


def test_frames_and_reasons_from_the_file_stay_text() -> None:
    link = '<a href="https://evil.example">x</a>'
    frames = [{"filename": f"/home/{link}.py", "line": 1, "name": link}]
    trace = [{"action": "alloc", "addr": 1, "size": 10, "frames": frames}]
    mm = memory_map_from_summary(summarize({"segments": [], "device_traces": [trace]}), reason=link)
    fig = snapshot_views.alloc_timeline_figure(mm)
    shown = json.dumps(fig)
    assert "<a " not in shown and "&lt;a href" in shown


def test_a_snapshot_without_history_says_how_to_record_one() -> None:
    mm = memory_map_from_summary(summarize({"segments": [], "device_traces": [[]]}))
    view = snapshot_views.alloc_timeline_view([mm], None, "cursor")
    assert isinstance(view, str) and "_record_memory_history" in view
    assert "no snapshot recorded" in str(snapshot_views.alloc_timeline_view([], None, "cursor"))


def test_imported_snapshot_on_the_run_page(tmp_path: Path) -> None:
    run = tmp_path / "imported"
    assert cli(["import-snapshot", str(REAL), str(run)]) == 0
    page = build_run_page("imported", RunReader(run))
    graph = find(page, "alloc-timeline")
    assert graph is not None and find(page, "alloc-timeline-box") is not None
    assert any("model.py:" in str(t.get("hovertext")) for t in graph.figure["data"])
    seg = find(page, "segment-map")
    assert seg is not None and "showing the 60 largest of 216 segments" in str(seg.figure["layout"]["annotations"])


def test_timeline_callback_follows_the_chosen_snapshot(tmp_path: Path) -> None:
    from helpers.dashpost import post

    from gpudash.server.app import create_app

    run = tmp_path / "imported"
    assert cli(["import-snapshot", str(REAL), str(run), "--step", "3"]) == 0
    app = create_app(tmp_path)
    client = app.server.test_client()
    state = {"page-run.data": {"run": "imported", "rank": 0}, "alloc-timeline-key.data": None}
    r = post(client, app, "alloc-timeline-box.children", {"cursor-slider.value": 0, "snapshot-pick.value": "cursor"},
             state)
    assert r.status_code == 200
    out = r.json["response"]
    graph, zoom = out["alloc-timeline-box"]["children"]["props"]["children"]
    assert graph["props"]["id"] == "alloc-timeline" and graph["props"]["figure"]["data"][0]["type"] == "bar"
    assert zoom["props"]["id"] == "alloc-timeline-zoom"  # the zoom store comes (new) with its graph
    key = out["alloc-timeline-key"]["data"]
    assert key == [1, 0]
    # the same snapshot again (the cursor moving on): nothing is resent
    again = post(client, app, "alloc-timeline-box.children", {"cursor-slider.value": 9, "snapshot-pick.value": "0"},
                 dict(state, **{"alloc-timeline-key.data": key}))
    assert again.status_code == 204
    bad = post(client, app, "alloc-timeline-box.children", {"cursor-slider.value": 0, "snapshot-pick.value": [1]},
               state)
    assert bad.status_code == 400 and "Traceback" not in bad.get_data(as_text=True)


def test_zoom_redraws_the_window_from_the_zoom_store(tmp_path: Path) -> None:
    """The server hears zooms from ``alloc-timeline-zoom`` (the browser passes on only x changes of the
    timeline's relayoutData: an ``{"autosize": true}`` no longer supersedes a zoom being answered)."""
    from helpers.dashpost import post

    from gpudash.server.app import create_app
    from gpudash.server.layouts.viewstate import ZOOM_JS

    run = tmp_path / "imported"
    assert cli(["import-snapshot", str(REAL), str(run), "--step", "3"]) == 0
    app = create_app(tmp_path)
    client = app.server.test_client()
    state = {"page-run.data": {"run": "imported", "rank": 0}, "alloc-timeline-key.data": [1, 0]}
    r = post(client, app, "alloc-timeline.figure",
             {"alloc-timeline-zoom.data": {"xaxis.range[0]": 1000, "xaxis.range[1]": 1400}}, state)
    assert r.status_code == 200
    meta = r.json["response"]["alloc-timeline"]["figure"]["layout"]["meta"]
    assert meta["window"] == [1000, 1400] and meta["sampled"] == 401
    reset = post(client, app, "alloc-timeline.figure", {"alloc-timeline-zoom.data": {"xaxis.autorange": True}}, state)
    assert reset.json["response"]["alloc-timeline"]["figure"]["layout"]["meta"]["window"] is None
    assert post(client, app, "alloc-timeline.figure", {"alloc-timeline-zoom.data": {"autosize": True}},
                state).status_code == 204
    # the browser's filter passes the payloads the server reads as a zoom or a reset, and nothing else
    deps = [d for d in app._callback_list if "alloc-timeline-zoom.data" in str(d["output"])]
    assert len(deps) == 1 and deps[0]["clientside_function"] is not None
    assert all(k in ZOOM_JS for k in ("xaxis.autorange", "xaxis.range[0]", "xaxis.range[1]", "'xaxis.range'"))


def test_bands_fit_the_bar_budget() -> None:
    """A bar per stretch of a band is what the browser pays for: over ``max_pieces`` stretches, fewer bands
    are drawn on their own (the rest merged), as many as fit."""
    from gpudash.analysis.snapshot_trace import allocation_timeline

    mm = load_snapshot(REAL)
    whole = allocation_timeline(mm)
    assert whole is not None and len(whole.bands) == 200
    pieces = sum(len(b.xs) for b in whole.bands)
    tight = allocation_timeline(mm, max_pieces=pieces // 2)
    assert tight is not None and sum(len(b.xs) for b in tight.bands) <= pieces // 2
    assert 20 < len(tight.bands) < 200 and tight.merged == whole.merged + 200 - len(tight.bands)
    fig = snapshot_views.alloc_timeline_figure(mm, tight)
    assert len(fig.data[0].x) <= pieces // 2


def test_serve_head_start_decodes_the_newest_snapshot(tmp_path: Path) -> None:
    """``gpudash serve`` warms the newest run before a browser asks: its snapshots decoded and the shown one's
    whole-trace timeline built, so the first visit reads them from the caches (a 1M-entry snapshot decodes in seconds)."""
    from gpudash.server.layouts import snapshot_views
    from gpudash.server.layouts.pages import warm_run
    from gpudash.server.runcache import shared_cache

    run = tmp_path / "imported"
    assert cli(["import-snapshot", str(REAL), str(run)]) == 0
    snapshot_views._SNAP_CACHE.clear()
    snapshot_views._FIGURES.clear()
    warm_run(run)
    reader, _ = shared_cache().reader(run)
    maps = snapshot_views.load_snapshots(reader)
    assert len(snapshot_views._SNAP_CACHE) == 1 and len(maps) == 1  # decoded by the head start, read back
    warm_fig = snapshot_views._FIGURES[id(maps[-1])][1]
    assert snapshot_views.alloc_timeline_figure(maps[-1]) is warm_fig  # the page gets the figure already built
