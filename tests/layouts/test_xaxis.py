"""The step graphs' x axis (gpudash.server.layouts.xaxis): time modes drawn from the recorded times, the zoom kept in
steps, the live state's series in the same units, the choice in the address."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpudash.server.layouts.fig import Fig, decode_array
from gpudash.server.layouts.inputs import BadInput, live_state
from gpudash.server.layouts.series import Series, series_xy
from gpudash.server.layouts.viewstate import view_search, with_xmode, xmode_of, zoom_range
from gpudash.server.layouts.xaxis import XAxis, axis_range, mode_of, style_figure, with_x, x_of, x_origin

STEPS = pd.DataFrame({"rank": [0, 0, 0], "step": [0, 1, 2], "time": [1010.0, 1011.0, 1013.0],
                      "duration_s": [10.0, 0.9, 1.8], "loss": [3.0, 2.0, 1.0]})


def test_modes_from_the_address() -> None:
    assert xmode_of({"x": ["relative"]}) == "relative" and xmode_of({"x": ["wall"]}) == "wall"
    assert xmode_of({}) == "step" and xmode_of({"x": ["<script>"]}) == "step" and mode_of(3) == "step"
    assert with_xmode("?cursor=3", "relative") == "?cursor=3&x=relative"
    assert with_xmode("?cursor=3&x=wall", "step") == "?cursor=3"
    assert "x=wall" in view_search("?x=wall&x0=1&x1=2", 5, None)  # the view's own updates keep it


def test_relative_time_from_the_first_step_start_and_wall_time_local() -> None:
    x = XAxis("relative", x_origin("relative", STEPS))
    assert x.origin == 1000.0  # step 0 began 10 s before it ended
    spec = with_x([Series("steps", "loss", "loss")], x)[0]
    assert (spec.x, spec.origin) == ("relative", 1000.0)
    xs, ys = series_xy(spec, STEPS)
    assert xs == [10_000.0, 11_000.0, 13_000.0] and ys == [3.0, 2.0, 1.0]  # ms on the date axis
    wall = XAxis("wall", x_origin("wall", STEPS))
    wx, _ = series_xy(with_x([Series("steps", "loss", "loss")], wall)[0], STEPS)
    assert wx[0] == pytest.approx((1010.0 - wall.origin) * 1000.0)
    elapsed = Series("host", "cpu_pct", "cpu", x="elapsed")
    assert with_x([elapsed], x) == [elapsed]  # graphs against elapsed seconds stay as they are
    assert with_x([spec], None) == [spec] and with_x([Series("steps", "loss", "l")], XAxis())[0].x == "step"


def test_time_axis_and_lines_at_a_step_move_to_its_time() -> None:
    fig = Fig({"xaxis": {"title": {"text": "step"}}})
    fig.add_vline(1.0, text="OOM")
    style_figure(fig, XAxis("relative", 1000.0), STEPS)
    ax = fig.layout["xaxis"]
    assert ax["type"] == "date" and ax["uirevision"] == "relative"
    assert [st["value"] for st in ax["tickformatstops"]] == ["%-H:%M:%S.%L", "%-H:%M:%S", "day %-j"]
    assert fig.layout["shapes"][0]["x0"] == 11_000.0 and fig.layout["annotations"][0]["x"] == 11_000.0
    step = Fig({"xaxis": {"type": "date"}})
    style_figure(step, XAxis(), STEPS)
    assert step.layout["xaxis"]["type"] == "linear"  # said outright when switching back


def test_zoom_of_a_date_axis_and_a_resize_is_not_a_zoom() -> None:
    x = XAxis("relative", 1000.0)
    assert axis_range({"xaxis.range[0]": "1970-01-01 00:00:10", "xaxis.range[1]": "1970-01-01 00:00:12.5"}, x) \
        == (10_000.0, 12_500.0)
    assert axis_range({"xaxis.range": [10_000, 12_000]}, x) == (10_000.0, 12_000.0)
    assert axis_range({"xaxis.autorange": True}, x) is True
    assert axis_range({"xaxis.range[0]": 2, "xaxis.range[1]": 5}, XAxis()) == (2.0, 5.0)
    assert zoom_range({"autosize": True}) is None and axis_range({"autosize": True}, x) is None  # was a reset
    with pytest.raises(BadInput):
        axis_range({"xaxis.range[0]": "not a date", "xaxis.range[1]": 1}, x)


def test_live_state_carries_the_axis() -> None:
    spec = with_x([Series("steps", "loss", "loss")], XAxis("wall", -3600.0))[0]
    state: dict[str, Any] = {"run": "r", "specs": {"loss-graph": [spec.as_dict()]}, "x": {"mode": "wall",
                                                                                        "origin": -3600.0}}
    checked = live_state(state)
    assert Series.from_dict(checked["specs"]["loss-graph"][0]) == spec and x_of(checked) == XAxis("wall", -3600.0)
    assert x_of({"run": "r"}) == XAxis()
    with pytest.raises(BadInput):
        x_of({"x": {"mode": "sideways"}})
    with pytest.raises(BadInput):
        live_state({"run": "r", "specs": {"g": [dict(spec.as_dict(), origin="soon")]}})


def test_page_from_a_link_in_relative_time(runs_dir: Path) -> None:
    from gpudash.server.layouts.pages import build_run_page
    from gpudash.server.runcache import shared_cache

    reader, lock = shared_cache().reader(runs_dir / "plain")
    with lock:
        page = build_run_page("plain", reader, xrange=(5.0, 20.0), xmode="relative")
    found: dict[str, Any] = {}

    def walk(c: Any) -> None:
        if isinstance(c, list | tuple):
            for v in c:
                walk(v)
        elif c is not None and not isinstance(c, str | int | float):
            if isinstance(getattr(c, "id", None), str):
                found[c.id] = c
            walk(getattr(c, "children", None))

    walk(page)
    assert found["x-mode"].value == "relative"
    fig = found["loss-graph"].figure
    assert fig["layout"]["xaxis"]["type"] == "date"
    xs = fig["data"][0]["x"]
    lo, hi = fig["layout"]["xaxis"]["range"]
    assert len(xs) == 16 and abs(lo - xs[0]) < 1e-3 and abs(hi - xs[-1]) < 1e-3  # steps 5..20, drawn at their times
    assert found["live-state"].data["x"]["mode"] == "relative"


def test_zoom_on_a_time_axis_rereads_the_steps_in_it(tmp_path: Path) -> None:
    """A downsampled run on relative time: a zoom (date strings) re-reads the steps recorded in that time,
    at full resolution, and the address keeps the zoom in steps."""
    import json
    from datetime import datetime, timezone

    from gpudash.server.app import create_app
    from gpudash.server.layouts.downsample import MAX_POINTS
    from gpudash.store.writer import Recorder

    n = 3 * MAX_POINTS
    rec = Recorder(tmp_path / "runs" / "long", flush_interval=0.2, capacity=2 * n + 10, meta={"device": "cpu"})
    for s in range(n):
        rec.put("steps", {"step": s, "time": 1000.0 + 0.5 * (s + 1), "duration_s": 0.5, "loss": 1.0 + (s % 7)})
    rec.close()
    app = create_app(tmp_path / "runs")
    client = app.server.test_client()
    state = {"run": "long", "rank": 0, "downsampled": True, "x": {"mode": "relative", "origin": 1000.0}}

    def date(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    relayout = {"xaxis.range[0]": date(50.0), "xaxis.range[1]": date(100.0)}  # steps 99..199 ended then
    key = next(k for k in app.callback_map if k.startswith("loss-graph.figure@")
               and app.callback_map[k]["inputs"][0]["id"] == "loss-graph-zoom")
    body = {"output": key, "outputs": {"id": "loss-graph", "property": "figure"},
            "inputs": [{"id": "loss-graph-zoom", "property": "data", "value": relayout}],
            "state": [{"id": "live-state", "property": "data", "value": state},
                      {"id": "cursor-slider", "property": "value", "value": None},
                      {"id": "smoothing", "property": "value", "value": 0}],
            "changedPropIds": ["loss-graph-zoom.data"]}
    resp = client.post("/_dash-update-component", json=body)
    assert resp.status_code == 200, resp.data[:300]
    fig = resp.get_json()["response"]["loss-graph"]["figure"]
    xs = list(decode_array(fig["data"][0]["x"]))  # sent as a typed array (gpudash.server.layouts.fig.wire)
    assert fig["layout"]["xaxis"]["type"] == "date" and len(xs) == 101  # every step in the range, no sampling
    assert xs[0] == pytest.approx(50_000.0) and xs[-1] == pytest.approx(100_000.0)
    url_key = next(k for k in app.callback_map if "url.search" in k and any(
        i["id"] == "cursor-slider" for i in app.callback_map[k]["inputs"]))
    spec = app.callback_map[url_key]
    values = {"loss-graph-zoom.data": relayout, "live-state.data": state, "url.search": "?x=relative",
              "run-status.children": "finished"}
    props = lambda items: [{"id": i["id"], "property": i["property"],  # noqa: E731
                            "value": values.get(f"{i['id']}.{i['property']}")} for i in items]
    resp = client.post("/_dash-update-component", json={
        "output": url_key, "outputs": {"id": "url", "property": "search"}, "inputs": props(spec["inputs"]),
        "state": props(spec["state"]), "changedPropIds": ["loss-graph-zoom.data"]})
    assert resp.status_code == 200, resp.data[:300]
    assert json.dumps(resp.get_json()).count("x0=99&x1=199") == 1
