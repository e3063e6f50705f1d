"""Crafted callback inputs are bad requests (400, one line, no traceback), never 500s; the snapshot
button writes a request only into a live run and at most once per few seconds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.dashpost import post
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudash.server.app import create_app
from gpudash.server.layouts.callbacks import SnapshotRequests, event_inputs
from gpudash.server.layouts.inputs import BadInput, as_int, live_state, page_run
from gpudash.server.layouts.viewstate import zoom_range
from gpudash.store.schema import SNAPSHOT_REQUEST_FILE

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def app(runs_dir: Path) -> Any:
    return create_app(runs_dir)


def _ok(r: Any) -> None:
    body = r.get_data(as_text=True)
    assert r.status_code in (200, 204, 400), (r.status_code, body[:300])
    assert "Traceback" not in body
    if r.status_code == 400:
        assert body.startswith("gpudash: bad request:") and body.count("\n") == 1


def _page_stores(app: Any, client: Any, run: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "Store":
                out[node["props"]["id"]] = node["props"].get("data")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(post(client, app, "page.children", {"url.pathname": f"/run/{run}", "url.search": ""}).json)
    return out


CRAFTED = [
    ("page.children", {"url.pathname": "/run/rich", "url.search": "?rank=²"}, {}, None),
    ("page.children", {"url.pathname": ["/run/rich"], "url.search": None}, {}, None),
    ("cursor-label.children", {"cursor-slider.value": 1e308}, {"page-run.data": {"run": "rich", "rank": 0}}, None),
    ("cursor-label.children", {"cursor-slider.value": 10**30}, {"page-run.data": {"run": "rich", "rank": 0}}, None),
    ("cursor-label.children", {"cursor-slider.value": 3}, {"page-run.data": {"run": "rich", "rank": "abc"}}, None),
    ("cursor-label.children", {"cursor-slider.value": "abc"}, {"page-run.data": {"run": "rich"}}, None),
    ("cursor-slider.value", {"play-interval.n_intervals": 1},
     {"cursor-slider.value": "abc", "cursor-slider.min": 0, "cursor-slider.max": 9, "speed.value": 1,
      "page-run.data": {"run": "rich"}}, None),
    ("cursor-slider.value", {"next-event.n_clicks": 1},
     {"cursor-slider.value": 0, "cursor-slider.min": 0, "cursor-slider.max": 9, "speed.value": 1,
      "page-run.data": {"run": "rich"}, "events-rows.data": [{"step": 1e308}]}, "next-event.n_clicks"),
    ("cursor-slider.value", {"events-graph.clickData": {"points": [{"customdata": float("inf")}]}},
     {"cursor-slider.value": 0, "cursor-slider.min": 0, "cursor-slider.max": 9}, "events-graph.clickData"),
    ("memory-graph.figure", {"memory-graph-zoom.data": {"xaxis.range[0]": "a", "xaxis.range[1]": 2}},
     {"live-state.data": {"run": "rich", "downsampled": True}}, None),
    ("live-state.data", {"live-interval.n_intervals": 1},
     {"live-state.data": {"run": "rich", "rank": "abc", "cursor": {"0/steps": 1e308}}}, None),
    ("live-state.data", {"live-interval.n_intervals": 1},
     {"live-state.data": {"run": "rich", "specs": {"memory-graph": [{"table": 1}]}}}, None),
    ("summary-panel.children", {"summary-timer.n_intervals": 1}, {"page-run.data": {"run": 5}}, None),
    ("snapshot-requested.children", {"snapshot-request.n_clicks": 1}, {"page-run.data": ["rich"]}, None),
    ("compare-link.href", {'{"run":["ALL"],"type":"compare-pick"}.value': 5}, {}, None),
]


@pytest.mark.parametrize("output,inputs,state,trigger", CRAFTED)
def test_crafted_inputs_are_bad_requests(app: Any, output: str, inputs: dict[str, Any], state: dict[str, Any],
                                         trigger: str | None) -> None:
    r = post(app.server.test_client(), app, output, inputs, state, trigger)
    _ok(r)
    assert r.status_code in (200, 400)


def test_huge_rank_file_is_not_a_rank(runs_dir: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    shutil.copytree(runs_dir / "plain", runs / "big")
    for f in (runs / "big").glob("rank0.db*"):
        f.rename(f.with_name(f.name.replace("rank0", "rank99999999999999999999")))
    app = create_app(runs)
    client = app.server.test_client()
    assert client.get("/api/runs/big/summary").status_code == 200
    stores = _page_stores(app, client, "big")
    page, state = stores["page-run"], stores["live-state"]
    for r in (post(client, app, "live-state.data", {"live-interval.n_intervals": 1},
                   {"live-state.data": state, "page-run.data": page}),
              post(client, app, "cursor-label.children", {"cursor-slider.value": 1}, {"page-run.data": page}),
              post(client, app, "ranks-box.children", {"run-status.children": "finished"}, {"page-run.data": page},
                   "run-status.children"),
              post(client, app, "summary-panel.children", {"summary-timer.n_intervals": 1}, {"page-run.data": page})):
        _ok(r)
        assert r.status_code in (200, 204)


def test_real_page_state_round_trips(app: Any) -> None:
    """What the server put in the page passes the input checks (the checks refuse only what it never sends)."""
    client = app.server.test_client()
    stores = _page_stores(app, client, "rich")
    state = json.loads(json.dumps(stores["live-state"]))
    assert live_state(state)["run"] == "rich" and page_run(stores["page-run"]) == ("rich", 0)
    r = post(client, app, "live-state.data", {"live-interval.n_intervals": 1},
             {"live-state.data": state, "page-run.data": stores["page-run"], "cursor-slider.value": 1,
              "cursor-slider.max": 39})
    assert r.status_code == 200
    r = post(client, app, "memory-graph.figure", {"memory-graph-zoom.data": {"xaxis.range": [2, 20]}},
             {"live-state.data": dict(state, downsampled=True)})
    assert r.status_code == 200


_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("output", ["page.children", "cursor-label.children", "cursor-slider.value",
                                    "memory-graph.figure", "live-state.data", "ranks-box.children",
                                    "summary-panel.children", "snapshot-requested.children", "compare-link.href"])
def test_any_json_is_never_a_500(app: Any, output: str) -> None:
    from helpers.dashpost import callback_key

    spec = app.callback_map[callback_key(app, output)]
    names = [f"{i['id']}.{i['property']}" for i in spec["inputs"] + spec["state"]]
    client = app.server.test_client()

    @_SETTINGS
    @given(values=st.fixed_dictionaries({n: JSON for n in names}), run=st.sampled_from(["rich", "plain", None]))
    def check(values: dict[str, Any], run: str | None) -> None:
        for n in ("page-run.data", "live-state.data"):
            if run and n in values and isinstance(values[n], dict):
                values[n]["run"] = run  # reach past the run-id check into the callback body
        ins = {n: values[n] for n in names[:len(spec["inputs"])]}
        _ok(post(client, app, output, ins, values))

    check()


@_SETTINGS
@given(value=JSON)
def test_pure_parsers_raise_only_bad_input(value: Any) -> None:
    for fn in (zoom_range, live_state, page_run, lambda v: as_int(v, "x"),
               lambda v: event_inputs(v, None, None), lambda v: event_inputs(None, v, None),
               lambda v: event_inputs(None, None, v)):
        try:
            fn(value)
        except BadInput:
            pass


def test_snapshot_requests_only_live_and_rate_limited(tmp_path: Path) -> None:
    now = [100.0]
    reqs = SnapshotRequests(every_s=5.0, clock=lambda: now[0])
    file = tmp_path / SNAPSHOT_REQUEST_FILE
    assert "not requested" in reqs.ask("r", tmp_path, "finished") and not file.exists()
    assert "requested at" in reqs.ask("r", tmp_path, "live") and file.exists()
    file.unlink()
    now[0] += 2
    assert "wait 3 s" in reqs.ask("r", tmp_path, "live") and not file.exists()
    now[0] += 3
    assert "requested at" in reqs.ask("r", tmp_path, "live") and file.exists()


def test_snapshot_button_on_a_finished_run_writes_nothing(app: Any, runs_dir: Path) -> None:
    r = post(app.server.test_client(), app, "snapshot-requested.children", {"snapshot-request.n_clicks": 1},
             {"page-run.data": {"run": "rich", "rank": 0}})
    assert r.status_code == 200 and "only a live run" in r.get_data(as_text=True)
    assert not (runs_dir / "rich" / SNAPSHOT_REQUEST_FILE).exists()


def test_dashpost_matches_dash(app: Any) -> None:
    """The helper posts what Dash expects: a valid routing call renders the runs table."""
    r = post(app.server.test_client(), app, "page.children", {"url.pathname": "/", "url.search": ""})
    assert r.status_code == 200 and "runs-table" in r.get_data(as_text=True)
