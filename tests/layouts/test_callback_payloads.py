"""The callbacks' bodies, pure functions, fed what a real browser sent (``payloads/``, recorded by
``record_payloads.py``): each answers as the page expects, and refuses what no page sends (BadInput: the app's
one-line 400). Every recorded payload also goes through the app, so the wiring still takes what browsers send."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from dash import Patch, no_update
from dash.exceptions import PreventUpdate
from helpers.dashpost import callback_key
from helpers.runmaker import train

from gpudash.server.app import create_app
from gpudash.server.layouts import run_page
from gpudash.server.layouts.inputs import BadInput
from gpudash.server.layouts.live_callbacks import LIVE_OUTPUTS, live_outputs
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.replay_callbacks import (
    SnapshotRequests,
    follow_cursor,
    move_cursor,
    snapshot_now,
    toggle_play,
)
from gpudash.server.layouts.routing import route_page
from gpudash.server.layouts.run_callbacks import (
    RANKS_EVERY,
    ranks_refresh,
    smoothing_redraw,
    summary_panel,
    view_address,
    zoom_redraw,
)
from gpudash.server.layouts.runs_callbacks import compare_baseline, compare_href, runs_page_no, runs_refresh
from gpudash.server.layouts.snapshot_callbacks import (
    alloc_timeline_box,
    alloc_timeline_zoom,
    run_page_diff,
    snapshot_pick,
)
from gpudash.server.layouts.viewstate import zoom_store
from gpudash.server.layouts.xaxis_callbacks import cursor_in_time, switch_x
from gpudash.store.reader import RunReader

PAYLOADS = Path(__file__).parent / "payloads"
LAYOUTS = Path(__file__).resolve().parents[2] / "gpudash" / "server" / "layouts"


def recorded(name: str) -> list[dict[str, Any]]:
    return list(json.loads((PAYLOADS / f"{name}.json").read_text()))


def values(p: dict[str, Any]) -> dict[str, Any]:
    """``"id.property" -> value`` of a payload's inputs and states (a pattern input: the list of its values)."""
    out: dict[str, Any] = {}
    for item in [*p["inputs"], *p.get("state", [])]:
        if isinstance(item, list):
            out.setdefault("ALL", []).extend(i.get("value") for i in item)
        else:
            out[f"{item['id']}.{item['property']}"] = item.get("value")
    return out


def trigger(p: dict[str, Any]) -> str | None:
    """The id Dash's ``triggered_id`` gives: the first input that changed."""
    return p["changedPropIds"][0].rsplit(".", 1)[0] if p["changedPropIds"] else None


def fired(name: str, prop_id: str) -> dict[str, Any]:
    """The recorded payload of ``name`` that ``prop_id`` alone fired."""
    return next(p for p in recorded(name) if p["changedPropIds"] == [prop_id])


@pytest.fixture(scope="module")
def runs(runs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs the payloads were recorded over: ``rich``, ``plain`` and ``live`` (ended since)."""
    root = tmp_path_factory.mktemp("payload-runs")
    for run in ("rich", "plain"):
        shutil.copytree(runs_dir / run, root / run)
    train(root / "live", 30, name="live-run")
    return root


@pytest.fixture(scope="module")
def readers(runs: Path) -> ReaderCache:
    return ReaderCache(runs)


def test_fixtures_are_small_and_cover_the_callbacks() -> None:
    files = sorted(PAYLOADS.glob("*.json"))
    assert sum(f.stat().st_size for f in files) < 400_000
    names = {f.stem for f in files}
    for want in ("page.children--url", "live-state.data--live-interval", "cursor-slider.value--play-interval",
                 "cursor-label.children--cursor-slider", "url.search--cursor-slider", "loss-graph.figure--smoothing",
                 "loss-graph.figure--loss-graph-zoom", "ranks-box.children--ranks-tick",
                 "summary-panel.children--summary-timer", "snapshot-requested.children--snapshot-request"):
        assert want in names


def test_every_recorded_payload_is_answered(runs: Path) -> None:
    """The app takes each payload a browser sent (a renamed input or output shows up here: record again)."""
    app = create_app(runs)
    client = app.server.test_client()
    for f in sorted(PAYLOADS.glob("*.json")):
        for p in json.loads(f.read_text()):
            assert p["output"] in app.callback_map, f"{f.name}: no such callback now; run record_payloads.py"
            r = client.post("/_dash-update-component", json=p)
            assert r.status_code in (200, 204), (f.name, p["changedPropIds"], r.get_data(as_text=True)[:300])


# --- routing -------------------------------------------------------------------------------------------------


def _route(p: dict[str, Any], readers: ReaderCache, runs: Path) -> Any:
    v = values(p)
    return route_page(v["url.pathname"], v["url.search"], v["shown-page.data"],
                      path_changed="url.pathname" in p["changedPropIds"], prefix="", runs_dir=runs, readers=readers)


def test_route_draws_the_pages_the_browser_opened(readers: ReaderCache, runs: Path) -> None:
    pages = recorded("page.children--url")
    home = next(p for p in pages if values(p)["url.pathname"] == "/")
    _, here = _route(home, readers, runs)
    assert here == {"path": "/", "rank": "0", "query": []}
    opened = next(p for p in pages if values(p)["url.pathname"] == "/run/rich" and "url.pathname" in p["changedPropIds"])
    tree, here = _route(opened, readers, runs)
    assert here == {"path": "/run/rich", "rank": "0"} and "run-page" in json.dumps(tree, default=str)


def test_route_keeps_the_page_when_only_its_view_moved(readers: ReaderCache, runs: Path) -> None:
    moved = next(p for p in recorded("page.children--url") if p["changedPropIds"] == ["url.search"]
                 and values(p)["url.pathname"].startswith("/run/"))
    with pytest.raises(PreventUpdate):  # the cursor written into the address: no redraw
        _route(moved, readers, runs)


@pytest.mark.parametrize("path,search", [(["/run/rich"], ""), ("/run/rich", 5), ({"a": 1}, None)])
def test_route_bad_address(readers: ReaderCache, runs: Path, path: Any, search: Any) -> None:
    with pytest.raises(BadInput):
        route_page(path, search, None, path_changed=True, prefix="", runs_dir=runs, readers=readers)


def test_route_under_a_proxy_prefix(readers: ReaderCache, runs: Path) -> None:
    _, here = route_page("/proxy/8050/run/rich", "", None, path_changed=True, prefix="/proxy/8050", runs_dir=runs,
                         readers=readers)
    assert here["path"] == "/run/rich"


# --- the replay bar ------------------------------------------------------------------------------------------


def _move(p: dict[str, Any], **change: Any) -> int:
    v = {**values(p), **change}
    return move_cursor(change.get("trigger", trigger(p)), v["events-graph.clickData"], v.get("events-table.active_cell"),
                       v["cursor-slider.value"], v["cursor-slider.min"], v["cursor-slider.max"], v["speed.value"],
                       v["page-run.data"], v["events-rows.data"], v["cursor-input.value"])


def test_cursor_moves_as_the_browser_asked() -> None:
    name = "cursor-slider.value--play-interval"
    prev = fired(name, "prev-event.n_clicks")
    assert _move(prev) == 36  # from the run's end to its OOM (step 36)
    played = fired(name, "play-interval.n_intervals")
    v = values(played)
    assert v["cursor-slider.value"] < _move(played) <= v["cursor-slider.max"]
    assert _move(played, **{"cursor-slider.value": v["cursor-slider.max"]}) == v["cursor-slider.min"]  # loops
    typed = fired(name, "cursor-input.n_submit")
    assert _move(typed) == 20
    assert _move(typed, **{"cursor-input.value": 10**6}) == values(typed)["cursor-slider.max"]  # within the run
    cell = next(p for p in recorded(name) if p["changedPropIds"] == ["events-table.active_cell"]
                and values(p)["events-table.active_cell"])
    cv = values(cell)
    assert _move(cell) == cv["events-rows.data"][cv["events-table.active_cell"]["row"]]["step"]
    table_made = next(p for p in recorded(name) if p["changedPropIds"] == ["events-table.active_cell"]
                      and not values(p)["events-table.active_cell"])
    with pytest.raises(PreventUpdate):  # the table built (scrolled to) fires with no cell: the cursor stays
        _move(table_made)


@pytest.mark.parametrize("change", [{"cursor-slider.value": "abc"}, {"events-rows.data": [{"step": 1e308}]},
                                    {"events-rows.data": {"step": 1}}, {"speed.value": "fast"},
                                    {"events-graph.clickData": {"points": 3}, "trigger": "events-graph"},
                                    {"cursor-input.value": "inf", "trigger": "cursor-input"}])
def test_cursor_bad_inputs(change: dict[str, Any]) -> None:
    played = fired("cursor-slider.value--play-interval", "play-interval.n_intervals")
    with pytest.raises(BadInput):
        _move(played, **change)


def test_play_button_toggles() -> None:
    v = values(recorded("play-interval.disabled--play-button")[0])
    assert toggle_play(v["play-interval.disabled"]) == (False, "⏸ pause")
    assert toggle_play(False) == (True, "▶ play")


def _follow(p: dict[str, Any], readers: ReaderCache, **change: Any) -> list[Any]:
    v = {**values(p), **change}
    return follow_cursor(v["cursor-slider.value"], v["snapshot-pick.value"], v["page-run.data"],
                         v["cursor-slider.max"], v["run-status.children"], v["cursor-follow.data"],
                         trigger=trigger(p), readers=readers)


def test_views_follow_the_cursor(readers: ReaderCache) -> None:
    p = recorded("cursor-label.children--cursor-slider")[0]
    out = _follow(p, readers)
    step = values(p)["cursor-slider.value"]
    assert out[0] == str(step) and len(out) == 5 + len(run_page.CURSOR_GRAPHS)
    assert f"step {step}" in json.dumps(out[1]["layout"]["title"])  # the breakdown at the cursor
    assert out[4]["follow"] is False  # a finished run: the cursor line shows
    assert all(isinstance(x, Patch) for x in out[5:])
    with pytest.raises(PreventUpdate):
        _follow(p, readers, **{"page-run.data": {"run": "gone", "rank": 0}})


@pytest.mark.parametrize("change", [{"snapshot-pick.value": 5}, {"cursor-slider.value": 1e308},
                                    {"page-run.data": {"run": "rich", "rank": "abc"}}, {"cursor-follow.data": [1]}])
def test_views_at_cursor_bad_inputs(readers: ReaderCache, change: dict[str, Any]) -> None:
    with pytest.raises(BadInput):
        _follow(recorded("cursor-label.children--cursor-slider")[0], readers, **change)


def test_snapshot_button_on_an_ended_run(readers: ReaderCache) -> None:
    page = values(recorded("snapshot-requested.children--snapshot-request")[0])["page-run.data"]
    asked = snapshot_now(page, readers=readers, requests=SnapshotRequests())
    assert asked.startswith("not requested: the run is finished")
    with pytest.raises(BadInput):
        snapshot_now(["live"], readers=readers, requests=SnapshotRequests())


# --- the live tick -------------------------------------------------------------------------------------------


def _tick(readers: ReaderCache, **change: Any) -> list[Any]:
    v = {**values(recorded("live-state.data--live-interval")[0]), **change}
    return live_outputs(v["live-interval.n_intervals"], v["live-state.data"], v["cursor-slider.value"],
                        v["cursor-slider.max"], v["page-run.data"], v["smoothing.value"], v["lazy-drawn.data"],
                        readers=readers)


def test_live_tick_on_the_recorded_state(readers: ReaderCache, runs: Path) -> None:
    out = dict(zip([f"{i}.{p}" for i, p in LIVE_OUTPUTS], _tick(readers), strict=True))
    assert out["live-state.data"]["run"] == "live" and out["live-state.data"]["status"] == "finished"
    # recorded while live, answered after the run ended: the status changes and the interval stops
    assert out["run-status.children"] == "finished" and out["run-status.className"] == "status status-finished"
    n = values(recorded("live-state.data--live-interval")[0])["live-interval.n_intervals"]
    assert out["live-interval.max_intervals"] == n + 1
    assert out["stability-lights.children"] is not no_update


def test_live_tick_from_the_start_extends_or_rebuilds(readers: ReaderCache, runs: Path) -> None:
    state = values(recorded("live-state.data--live-interval")[0])["live-state.data"]
    fresh = dict(state, cursor={}, last={}, tails={}, last_step=None, points={})
    out = dict(zip([f"{i}.{p}" for i, p in LIVE_OUTPUTS], _tick(readers, **{"live-state.data": fresh}), strict=True))
    last = int(RunReader(runs / "live").read_table("steps")["step"].max())
    assert out["last-step.children"] == str(last) and out["cursor-slider.max"] == last
    moved = [g for g in run_page.LIVE_GRAPHS
             if out[f"{g}.extendData"] is not no_update or out[f"{g}.figure"] is not no_update]
    assert "step-time-graph" in moved
    assert isinstance(out["throughput-stats.children"], list) and out["throughput-stats.children"]


@pytest.mark.parametrize("change", [{"live-interval.n_intervals": -1}, {"cursor-slider.value": "x"},
                                    {"page-run.data": "live"}])
def test_live_tick_bad_inputs(readers: ReaderCache, change: dict[str, Any]) -> None:
    with pytest.raises(BadInput):
        _tick(readers, **change)


def test_live_tick_bad_state(readers: ReaderCache) -> None:
    state = values(recorded("live-state.data--live-interval")[0])["live-state.data"]
    for bad in (dict(state, rank="abc"), dict(state, specs={"memory-graph": [{"table": 1}]}),
                dict(state, cursor={"0/steps": 1e308})):
        with pytest.raises(BadInput):
            _tick(readers, **{"live-state.data": bad})


def test_live_callback_module_reads_no_frames() -> None:
    """The live tick's reading and figures live in live.tick_view; the callback module only wires them."""
    tree = ast.parse((LAYOUTS / "live_callbacks.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {str(n.module).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"pandas", "numpy"}


# --- the run page's view -------------------------------------------------------------------------------------


def _address(p: dict[str, Any], readers: ReaderCache, **change: Any) -> str:
    v = {**values(p), **change}
    relayouts = [v[f"{zoom_store(g)}.data"] for g in run_page.STEP_GRAPHS]
    fired_by = trigger(p)  # a zoom store: the graph it belongs to (as the registered callback maps it)
    graph = next((g for g in run_page.STEP_GRAPHS if zoom_store(g) == fired_by), fired_by)
    return view_address(v["cursor-slider.value"], v["smoothing.value"], relayouts, v["url.search"],
                        v["run-status.children"], v["cursor-slider.max"], v["live-state.data"], trigger=graph,
                        readers=readers)


def test_view_goes_into_the_address(readers: ReaderCache) -> None:
    name = "url.search--cursor-slider"
    opened = recorded(name)[0]  # every input at once as the page wires: the run's end is no cursor
    with pytest.raises(PreventUpdate):
        _address(opened, readers)
    assert "smooth=0.9" in _address(fired(name, "smoothing.value"), readers)
    zoomed = next(p for p in recorded(name) if p["changedPropIds"] == ["loss-graph-zoom.data"])
    out = _address(zoomed, readers)
    assert "x0=5" in out and "x1=25" in out
    cursor = next(p for p in recorded(name) if p["changedPropIds"] == ["cursor-slider.value"])
    assert f"cursor={values(cursor)['cursor-slider.value']}" in _address(cursor, readers)


@pytest.mark.parametrize("change", [{"url.search": 5}, {"cursor-slider.value": "x"}, {"run-status.children": [1]}])
def test_view_address_bad_inputs(readers: ReaderCache, change: dict[str, Any]) -> None:
    with pytest.raises(BadInput):
        _address(fired("url.search--cursor-slider", "smoothing.value"), readers, **change)


def test_smoothing_redraws_loss_and_rates(readers: ReaderCache) -> None:
    v = values(recorded("loss-graph.figure--smoothing")[0])
    loss, rates, state = smoothing_redraw(v["smoothing.value"], v["live-state.data"], v["cursor-slider.value"],
                                          readers=readers)
    assert any("EMA 0.9" in str(t.get("name")) for t in loss["data"])
    assert any(d.get("fn") in ("ema", "rate_ema") for d in state["specs"]["rates-graph"])  # the tick extends these
    with pytest.raises(BadInput):
        smoothing_redraw(v["smoothing.value"], dict(v["live-state.data"], rank=-1), None, readers=readers)


def _zoom(p: dict[str, Any], readers: ReaderCache, **change: Any) -> Any:
    v = {**values(p), **change}
    store = str(trigger(p))
    return zoom_redraw(store.removesuffix("-zoom"), v[f"{store}.data"], v["live-state.data"], v["cursor-slider.value"],
                       v["smoothing.value"], readers=readers)


def test_zoom_requeries_a_downsampled_chart(readers: ReaderCache) -> None:
    zoomed = recorded("loss-graph.figure--loss-graph-zoom")[0]
    # the chart's own {"autosize": true} never reached the server (the page's filter, viewstate.ZOOM_JS): every
    # payload recorded is a zoom or a reset
    assert all("autosize" not in values(p)["loss-graph-zoom.data"] for p in recorded("loss-graph.figure--loss-graph-zoom"))
    with pytest.raises(PreventUpdate):  # not an x change: nothing to re-query
        _zoom(zoomed, readers, **{"loss-graph-zoom.data": {"autosize": True}})
    state = values(zoomed)["live-state.data"]
    if not state.get("downsampled"):
        with pytest.raises(PreventUpdate):  # every point already drawn: the browser zooms alone
            _zoom(zoomed, readers)
    fig = _zoom(zoomed, readers, **{"live-state.data": dict(state, downsampled=True)})
    assert fig["layout"]["xaxis"]["range"] == [5, 25]
    with pytest.raises(BadInput):
        _zoom(zoomed, readers, **{"loss-graph-zoom.data": {"xaxis.range[0]": "a", "xaxis.range[1]": 2}})


def test_ranks_refresh_waits_for_its_tick(readers: ReaderCache) -> None:
    every = next(p for p in recorded("ranks-box.children--ranks-tick")  # the 10th tick, as the page's filter
                 if values(p)["ranks-tick.data"] is not None)  # passed it on
    v = values(every)
    assert v["ranks-tick.data"] % RANKS_EVERY == 0
    with pytest.raises(PreventUpdate):  # one rank: no Ranks section to refresh
        ranks_refresh(v["ranks-tick.data"], v["page-run.data"], trigger=trigger(every), readers=readers)
    with pytest.raises(PreventUpdate):  # a tick between refreshes (a crafted request: the page never sends one)
        ranks_refresh(7, v["page-run.data"], trigger="ranks-tick", readers=readers)
    with pytest.raises(BadInput):
        ranks_refresh("x", v["page-run.data"], trigger="ranks-tick", readers=readers)
    with pytest.raises(BadInput):
        ranks_refresh(10, {"run": 5}, trigger="ranks-tick", readers=readers)


def test_summary_panel(runs: Path) -> None:
    for p in recorded("summary-panel.children--summary-timer"):
        children, style = summary_panel(values(p)["page-run.data"], runs_dir=runs)
        assert (children and style == {}) or (children == [] and style == {"display": "none"})
    with pytest.raises(BadInput):
        summary_panel({"run": 5}, runs_dir=runs)
    with pytest.raises(PreventUpdate):
        summary_panel({"run": "../etc"}, runs_dir=runs)


def test_dashpost_finds_the_recorded_callbacks(runs: Path) -> None:
    app = create_app(runs)
    assert callback_key(app, "live-state.data") == recorded("live-state.data--live-interval")[0]["output"]


# --- the x axis ----------------------------------------------------------------------------------------------


def _switch(p: dict[str, Any], readers: ReaderCache, **change: Any) -> list[Any]:
    v = {**values(p), **change}
    return switch_x(v["x-mode.value"], v["live-state.data"], v["url.search"], v["cursor-slider.value"],
                    v["smoothing.value"], readers=readers)


def test_x_axis_switch(readers: ReaderCache) -> None:
    shown, relative = recorded("memory-graph.figure--x-mode")[:2]
    assert values(shown)["x-mode.value"] == "step" and values(relative)["x-mode.value"] == "relative"
    with pytest.raises(PreventUpdate):  # the axis it already has
        _switch(shown, readers)
    *figs, state, search = _switch(relative, readers)
    assert len(figs) == len(run_page.STEP_GRAPHS) and state["x"]["mode"] == "relative" and "x=relative" in search
    state = values(relative)["live-state.data"]
    for bad in ({"url.search": 3}, {"live-state.data": dict(state, x={"mode": "furlongs"})},
                {"cursor-slider.value": "x"}):
        with pytest.raises(BadInput):
            _switch(relative, readers, **bad)


def test_cursor_line_in_time(readers: ReaderCache) -> None:
    p = recorded("memory-graph.figure--cursor-label")[0]
    v = values(p)
    with pytest.raises(PreventUpdate):  # a step axis: the replay callback already put the line at the step
        cursor_in_time(v["cursor-label.children"], v["live-state.data"], readers=readers)
    state = dict(v["live-state.data"], x={"mode": "relative", "origin": 0.0})
    patches = cursor_in_time(v["cursor-label.children"], state, readers=readers)
    assert len(patches) == len(run_page.CURSOR_GRAPHS) and all(isinstance(x, Patch) for x in patches)
    with pytest.raises(BadInput):
        cursor_in_time("abc", state, readers=readers)


# --- the runs list and the compare page ----------------------------------------------------------------------


def test_runs_list_search_and_pager(runs: Path) -> None:
    searched = recorded("runs-page-no.data--runs-prev")[0]
    v = values(searched)
    assert runs_page_no(v["runs-page-no.data"], v["runs-shown.data"], trigger=trigger(searched)) == 0
    assert runs_page_no(3, [0, 2], trigger="runs-next") == 1 and runs_page_no(3, None, trigger="runs-prev") == 2
    with pytest.raises(BadInput):
        runs_page_no("x", None, trigger="runs-next")
    for p in recorded("runs-table-box.children--runs-interval"):
        v = values(p)
        try:
            table, count, sig, *_ = runs_refresh(v["runs-search.value"], v["runs-status.value"],
                                                 v["runs-page-no.data"], v.get("ALL"), v["runs-shown.data"],
                                                 trigger=trigger(p), runs_dir=runs)
        except PreventUpdate:
            assert trigger(p) == "runs-interval"
            continue
        assert "rich" in json.dumps(table, default=str)
    for bad in ({"query": "x" * 501}, {"status": "zombie"}, {"picks": "rich"}):
        args = {"query": None, "status": None, "picks": None, **bad}
        with pytest.raises(BadInput):
            runs_refresh(args["query"], args["status"], 0, args["picks"], None, trigger="runs-search", runs_dir=runs)


def test_compare_link_and_baseline() -> None:
    for p in recorded("compare-link.href--compare-pick"):
        picked = [r for vals in values(p)["ALL"] for r in vals or []]
        out = compare_href(values(p)["ALL"])
        assert all(r in out for r in picked) and out.endswith("/compare") == (not picked)
    assert compare_href([["rich"], None, ["plain"]]).endswith("/compare?runs=rich%2Cplain")
    assert compare_href([None, []]).endswith("/compare")
    with pytest.raises(BadInput):
        compare_href(5)
    v = values(recorded("url.search--compare-baseline")[0])
    assert "base=1" in compare_baseline(1, v["url.search"])
    with pytest.raises(BadInput):
        compare_baseline("first", v["url.search"])


# --- the snapshot views --------------------------------------------------------------------------------------


def test_alloc_timeline_on_the_cursor(readers: ReaderCache) -> None:
    p = recorded("alloc-timeline-box.children--cursor-slider")[0]
    v = values(p)
    child, key = alloc_timeline_box(v["cursor-slider.value"], v["snapshot-pick.value"], v["page-run.data"], None,
                                    readers=readers)
    assert isinstance(key, list) and child is not None
    with pytest.raises(PreventUpdate):  # the same snapshot as drawn: the timeline stays
        alloc_timeline_box(v["cursor-slider.value"], v["snapshot-pick.value"], v["page-run.data"], key,
                           readers=readers)
    page = v["page-run.data"]
    with pytest.raises(PreventUpdate):  # the chart's own relayout after its first draw: no window to draw again
        alloc_timeline_zoom({"autosize": True}, key, page, readers=readers)
    fig = alloc_timeline_zoom({"xaxis.autorange": True}, key, page, readers=readers)
    assert fig["data"]
    for bad in ({"step": "x"}, {"pick": 3}):
        args = {"step": v["cursor-slider.value"], "pick": None, **bad}
        with pytest.raises(BadInput):
            alloc_timeline_box(args["step"], args["pick"], v["page-run.data"], None, readers=readers)


def test_run_page_snapshot_diff(readers: ReaderCache) -> None:
    v = values(recorded("snapshot-diff-box.children--snapshot-diff-pick")[0])
    diff, largest = run_page_diff(v["snapshot-diff-pick.value"], v["snapshot-pick.value"], v["cursor-slider.value"],
                                  v["page-run.data"], readers=readers)
    assert diff == [] and largest  # nothing picked to compare with: the largest allocations only
    with pytest.raises(BadInput):
        run_page_diff(None, 5, v["cursor-slider.value"], v["page-run.data"], readers=readers)
    with pytest.raises(PreventUpdate):
        snapshot_pick("0", None, None, None, readers=readers)
    with pytest.raises(BadInput):
        snapshot_pick("0", None, ["rich"], None, readers=readers)


def test_lazy_charts_and_tables_drawn_when_scrolled_to(readers: ReaderCache) -> None:
    from gpudash.server.layouts.lazy import LAZY, TABLES, lazy_outputs

    boxes = [box for box, _ in TABLES]
    for p in recorded("rates-graph.figure--lazy-seen"):
        v = values(p)
        rows = tuple(v.get(f"{rows_id}.data") for _, rows_id in TABLES)
        seen, drawn = v["lazy-seen.data"], v["lazy-drawn.data"]
        try:
            out = lazy_outputs(seen, drawn, v["page-run.data"], v["url.search"], v["cursor-slider.value"],
                               v["cursor-follow.data"], v["smoothing.value"], rows, readers=readers)
        except PreventUpdate:  # everything it saw was drawn already
            assert all(g in (drawn or []) for g in seen or [])
            continue
        figs, tables, now_drawn = out[:len(LAZY)], out[len(LAZY):-1], out[-1]
        wanted = [g for g in [*LAZY, *boxes] if g in (seen or []) and g not in (drawn or [])]
        assert all(g in now_drawn for g in wanted)
        assert all((f is not no_update) == (g in wanted) for g, f in zip(LAZY, figs, strict=True))
        assert all((t is not no_update) == (b in wanted) for b, t in zip(boxes, tables, strict=True))
    with pytest.raises(BadInput):
        lazy_outputs("all", [], {"run": "rich"}, "", None, None, None, (None,) * len(TABLES), readers=readers)


def test_progress_bar_refreshed_after_a_tick(runs: Path) -> None:
    from gpudash.server.layouts.pages import facts_for
    from gpudash.server.layouts.progressbar import progress_refresh

    for p in recorded("run-progress.children--last-step"):
        page = values(p)["page-run.data"]
        bar = progress_refresh(page, facts_of=lambda run_id: facts_for(runs / run_id))
        assert isinstance(bar, list)
    with pytest.raises(PreventUpdate):
        progress_refresh(None, facts_of=lambda run_id: None)
    with pytest.raises(PreventUpdate):
        progress_refresh({"run": "rich"}, facts_of=lambda run_id: None)
