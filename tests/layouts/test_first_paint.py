"""What the run page sends first (issue 18): compressed answers, figures as typed arrays that decode to the values
drawn, the charts below the fold as empty frames filled by their own callback as the page shows them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.dashpost import payload

from gpudash.server.layouts.fig import F4_TOLERANCE, Fig, decode_array, encode_array, wire


def _find(node: Any, key: str, value: Any) -> Any:
    """The first dict under ``node`` (JSON) with ``node[key] == value``."""
    if isinstance(node, dict):
        if node.get(key) == value:
            return node
        nodes: Any = node.values()
    elif isinstance(node, list):
        nodes = node
    else:
        return None
    for child in nodes:
        hit = _find(child, key, value)
        if hit is not None:
            return hit
    return None


def _body(resp: Any) -> Any:
    raw = resp.get_data()
    enc = resp.headers.get("Content-Encoding")
    if enc == "br":
        import brotli

        raw = brotli.decompress(raw)
    elif enc == "gzip":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def test_typed_arrays_decode_to_the_values() -> None:
    steps = list(range(0, 30_000, 3))
    loss = [float(v) for v in np.round(2.5 * np.exp(-np.arange(10_000) / 3e3) + 0.01 * np.sin(np.arange(10_000)), 6)]
    wall = [1.7e9 + 0.1 * i for i in range(10_000)]  # epoch seconds: float32 would move them by a minute
    big = [2**40 + i for i in range(20)]

    s, lo, w, b = (encode_array(v) for v in (steps, loss, wall, big))
    assert (s["dtype"], lo["dtype"], w["dtype"], b["dtype"]) == ("i4", "f4", "f8", "f8")
    assert decode_array(s) == steps and decode_array(w) == wall and decode_array(b) == big
    got = np.array(decode_array(lo))
    assert np.max(np.abs(got - loss)) <= F4_TOLERANCE * (max(loss) - min(loss))
    assert np.allclose(got, loss, rtol=2**-23, atol=0)  # float32 of each value, nothing coarser
    # bytes in MiB with 6 significant digits: float32 keeps every digit drawn
    mib = [float(v) for v in np.round(np.linspace(1000.0, 1500.0, 500), 3)]
    assert np.allclose(decode_array(encode_array(mib)), mib, rtol=1e-6)
    # what is not a numeric array is sent as it is: gaps, text, a few markers
    for keep in ([1.0, None] * 10, ["a"] * 20, [3, 4], [True] * 20):
        assert encode_array(keep) == keep


def test_wire_leaves_the_figure_as_built() -> None:
    fig = Fig({"title": {"text": "t"}})
    fig.add_trace({"x": list(range(100)), "y": [0.5 * i for i in range(100)], "name": "loss", "uid": "u"})
    fig.add_trace({"x": [20], "y": [50.0], "name": "spike"})
    sent = wire(fig)
    assert fig.data[0].x == list(range(100))  # the server's figure keeps its lists (tests, live extends)
    assert sent["data"][0]["x"]["dtype"] == "i4" and decode_array(sent["data"][0]["y"]) == fig.data[0].y
    assert sent["data"][1]["x"] == [20] and sent["layout"] is fig.layout


def test_run_page_compressed_typed_and_lazy(runs_dir: Path) -> None:
    """The route's answer is compressed; its charts are typed arrays that decode to the built figure; the charts
    below the fold are empty frames; the loss chart carries the spike."""
    from gpudash.server.app import create_app
    from gpudash.server.layouts.data import load_view
    from gpudash.server.layouts.lazy import EAGER, LAZY, PLACEHOLDER
    from gpudash.server.layouts.pages import facts_for
    from gpudash.server.layouts.run_page import build_graph
    from gpudash.store.reader import RunReader

    app = create_app(runs_dir)
    client = app.server.test_client()
    body = payload(app, "page.children", {"url.pathname": "/run/rich", "url.search": ""})
    resp = client.post("/_dash-update-component", json=body, headers={"Accept-Encoding": "gzip, br"})
    assert resp.status_code == 200 and resp.headers.get("Content-Encoding") in ("br", "gzip")
    page = _body(resp)["response"]["page"]["children"]
    loss = _find(page, "id", "loss-graph")["figure"]
    line = loss["data"][0]
    assert set(line["x"]) == {"dtype", "bdata"} and set(line["y"]) == {"dtype", "bdata"}
    reader = RunReader(runs_dir / "rich")
    try:
        facts = facts_for(reader.path)
        built, _ = build_graph("loss-graph", load_view(reader), spikes=list(facts.loss_spike_steps))
    finally:
        reader.close()
    assert decode_array(line["x"]) == built.data[0].x
    assert np.allclose(decode_array(line["y"]), built.data[0].y, rtol=1e-6)
    spike = next(t for t in loss["data"] if str(t.get("name", "")).startswith("spike"))
    assert decode_array(spike["x"]) == list(facts.loss_spike_steps) == [20]
    for g in EAGER:
        assert _find(page, "id", g)["figure"]["data"], g
    for g in LAZY:
        fig = _find(page, "id", g)["figure"]
        assert fig["data"] == [] and fig["layout"]["meta"] == PLACEHOLDER, g
    # a callback answered without compression for a client that does not take it
    plain = client.post("/_dash-update-component", json=body, headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers and json.loads(plain.get_data())["response"]


def test_compression_stays_behind_the_token(runs_dir: Path) -> None:
    from gpudash.server.app import create_app

    app = create_app(runs_dir, token="s3cret")
    client = app.server.test_client()
    body = payload(app, "page.children", {"url.pathname": "/run/rich", "url.search": ""})
    denied = client.post("/_dash-update-component", json=body, headers={"Accept-Encoding": "gzip"})
    assert denied.status_code == 401 and b"token" in denied.get_data()
    ok = client.post("/_dash-update-component", json=body,
                     headers={"Accept-Encoding": "gzip", "Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.headers.get("Content-Encoding") == "gzip"


@pytest.mark.parametrize("search", ["", "?cursor=10&x0=5&x1=15"])
def test_lazy_chart_filled_as_the_page_shows_it(runs_dir: Path, search: str) -> None:
    """A chart scrolled to is drawn with the address's zoom and the cursor line; once (the page says it is drawn)."""
    from gpudash.server.app import create_app
    from gpudash.server.layouts.lazy import EAGER

    app = create_app(runs_dir)
    client = app.server.test_client()
    state = {"lazy-drawn.data": list(EAGER), "page-run.data": {"run": "rich", "rank": 0}, "url.search": search,
             "cursor-slider.value": 10 if search else 39, "cursor-follow.data": {"follow": False},
             "smoothing.value": 0}
    fill = next(k for k in app.callback_map if k.endswith("...lazy-drawn.data..")).strip(".")
    body = payload(app, fill, {"lazy-seen.data": ["phases-graph", "rates-graph"]}, state)
    out = _body(client.post("/_dash-update-component", json=body))["response"]
    assert set(out) == {"phases-graph", "rates-graph", "lazy-drawn"}
    assert out["lazy-drawn"]["data"] == [*EAGER, "rates-graph", "phases-graph"]
    phases = out["phases-graph"]["figure"]
    assert phases["data"] and phases["layout"]["shapes"][0]["x0"] == (10 if search else 39)
    rates = out["rates-graph"]["figure"]
    assert decode_array(rates["data"][0]["x"])[0] >= (5 if search else 0)
    if search:
        assert phases["layout"]["xaxis"]["range"] == [5, 15] and rates["layout"]["xaxis"]["range"] == [5, 15]
    again = payload(app, fill, {"lazy-seen.data": ["rates-graph"]},
                    dict(state, **{"lazy-drawn.data": out["lazy-drawn"]["data"]}))
    assert client.post("/_dash-update-component", json=again).status_code == 204  # drawn already: nothing sent


def test_tables_built_when_scrolled_to(runs_dir: Path) -> None:
    """The events and hot-spots tables come as a line saying how many rows (dash_table's scripts are not
    loaded with the first screen), their rows in stores; scrolled to, each is built from its store."""
    from gpudash.server.app import create_app
    from gpudash.server.layouts.lazy import EAGER
    from gpudash.server.layouts.run_page import TABLE_PLACEHOLDER
    from gpudash.server.layouts.style import DRAW_FIRST

    app = create_app(runs_dir)
    client = app.server.test_client()
    body = payload(app, "page.children", {"url.pathname": "/run/rich", "url.search": ""})
    page = _body(client.post("/_dash-update-component", json=body))["response"]["page"]["children"]
    assert '"DataTable"' not in json.dumps(page)  # no table in the page as sent
    rows = _find(page, "id", "events-rows")["data"]
    hot = _find(page, "id", "hotspot-rows")["data"]
    assert rows and hot
    events_box = _find(page, "id", "events-box")["children"]
    assert events_box["props"]["className"].endswith(TABLE_PLACEHOLDER)
    assert events_box["props"]["children"].startswith(f"{len(rows)} event(s): the table is drawn when scrolled")
    # the first screen's charts are drawn first (a class the page's script reads), the others a task later
    for g in ("memory-graph", "step-time-graph", "loss-graph", "events-graph"):
        assert (DRAW_FIRST in _find(page, "id", g)["className"].split()) == (g in EAGER), g

    state = {"lazy-drawn.data": list(EAGER), "page-run.data": {"run": "rich", "rank": 0}, "url.search": "",
             "cursor-slider.value": 39, "cursor-follow.data": {"follow": False}, "smoothing.value": 0,
             "events-rows.data": rows, "hotspot-rows.data": hot}
    fill = next(k for k in app.callback_map if k.endswith("...lazy-drawn.data..")).strip(".")
    out = _body(client.post("/_dash-update-component", json=payload(
        app, fill, {"lazy-seen.data": ["events-box", "hotspots-box"]}, state)))["response"]
    assert set(out) == {"events-box", "hotspots-box", "lazy-drawn"}
    events_table = out["events-box"]["children"]
    assert events_table["type"] == "DataTable" and events_table["props"]["id"] == "events-table"
    assert events_table["props"]["data"] == rows
    assert out["hotspots-box"]["children"]["props"]["data"] == hot
    assert out["lazy-drawn"]["data"] == [*EAGER, "events-box", "hotspots-box"]
    # a run without hot spots: its box keeps saying why; the events table is built even when empty (live runs)
    out = _body(client.post("/_dash-update-component", json=payload(
        app, fill, {"lazy-seen.data": ["events-box", "hotspots-box"]},
        dict(state, **{"events-rows.data": [], "hotspot-rows.data": []}))))["response"]
    assert "hotspots-box" not in out and out["events-box"]["children"]["props"]["data"] == []
    bad = payload(app, fill, {"lazy-seen.data": ["events-box"]}, dict(state, **{"events-rows.data": "x"}))
    assert client.post("/_dash-update-component", json=bad).status_code == 400


def test_serve_answers_before_pandas(runs_dir: Path) -> None:
    """What ``gpudash serve`` does before it prints its address imports neither pandas nor IPython (pandas loads
    after, while the browser fetches its scripts); the run page is then right."""
    import subprocess
    import sys

    script = f"""
import sys
from pathlib import Path
from gpudash.commands.serve import run
from gpudash.server.app import create_app
from gpudash.server.deferred import Deferred, defer, without
without("IPython"); defer("numpy"); defer("pandas")
app = create_app(Path({str(runs_dir)!r}))
client = app.server.test_client()
assert client.get("/run/rich").status_code == 200
assert isinstance(sys.modules["pandas"], Deferred), "pandas was imported to build the app"
assert isinstance(sys.modules["numpy"], Deferred), "numpy was imported to build the app"
assert sys.modules.get("IPython") is None
import pandas as pd  # the stand-in, until something reads from it
frame = pd.DataFrame({{"a": [1, 2]}})
assert not isinstance(sys.modules["pandas"], Deferred) and int(frame["a"].sum()) == 3
from gpudash.server.layouts.callbacks import ReaderCache, page_for
page = page_for("/run/rich", "", Path({str(runs_dir)!r}), ReaderCache(Path({str(runs_dir)!r})))
assert "loss-graph" in str(page)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_finished_run_read_once(runs_dir: Path, tmp_path: Path) -> None:
    """A finished run's page takes its step tables from the run cache (read once for the analysis) only while
    no file of the run changed; the view is the same as read from the files."""
    import time

    import pandas as pd
    from helpers.runmaker import LiveRun

    from gpudash.server.layouts.data import load_view
    from gpudash.server.layouts.pages import facts_for, known_tables
    from gpudash.server.runcache import shared_cache
    from gpudash.store.reader import RunReader

    assert facts_for(runs_dir / "rich") is not None
    known = known_tables(runs_dir / "rich")
    assert known is not None and set(known) == {"steps", "memory", "problems"}
    assert known["problems"] == []  # what the cache's read found damaged (nothing here), for the page to say
    reader = RunReader(runs_dir / "rich")
    try:
        read, shared = load_view(reader), load_view(reader, known=known)
    finally:
        reader.close()
    for table in ("steps", "memory"):
        pd.testing.assert_frame_equal(read.full[table], shared.full[table])
        pd.testing.assert_frame_equal(read.frames[table], shared.frames[table])
    known["steps"]["added"] = 1.0  # a page's copy: the cached run is not changed through it
    assert "added" not in shared_cache().get(runs_dir / "rich").run.steps

    with LiveRun(tmp_path / "live", delay=0.02):  # returns once the run's file exists
        time.sleep(0.3)
        assert facts_for(tmp_path / "live") is not None
        assert known_tables(tmp_path / "live") is None  # live: its page reads the rows it notes
    (tmp_path / "live" / "extra.txt").write_text("changed")
    assert known_tables(tmp_path / "live") is None  # a file changed since it was cached


def test_compressed_bundles_kept_on_disk(runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started again sends plotly.js compressed as the last one did, without compressing it; with the
    cache turned off nothing is written."""
    import brotli

    from gpudash.server.app import create_app
    from gpudash.server.layouts.style import PLOTLY_BUNDLE, PLOTLY_URL

    def bundle(app: Any) -> Any:
        client = app.server.test_client()
        assert PLOTLY_URL in client.get("/run/rich").get_data(as_text=True)  # the address the page asks
        return client.get("/_dash-component-suites/" + PLOTLY_URL, headers={"Accept-Encoding": "br"})

    monkeypatch.setenv("GPUDASH_CACHE_DIR", str(tmp_path / "cache"))
    first = bundle(create_app(runs_dir))
    assert first.status_code == 200 and first.headers["Content-Encoding"] == "br"
    sent = first.get_data()
    plain = (Path(__import__("gpudash").__file__).parent.parent / PLOTLY_BUNDLE).read_bytes()
    assert brotli.decompress(sent) == plain
    assert [p.name for p in (tmp_path / "cache" / "bundles").iterdir() if not p.name.endswith(".tmp")]

    def no_compress(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("compressed again")

    monkeypatch.setattr(brotli, "compress", no_compress)
    again = bundle(create_app(runs_dir))
    assert again.status_code == 200 and again.get_data() == sent
    monkeypatch.undo()
    monkeypatch.setenv("GPUDASH_CACHE_DIR", str(tmp_path / "cache"))
    (stored,) = (tmp_path / "cache" / "bundles").iterdir()
    stored.write_bytes(stored.read_bytes()[:-100])  # damaged (a truncated copy): compressed again, not sent
    damaged = bundle(create_app(runs_dir))
    assert damaged.status_code == 200 and brotli.decompress(damaged.get_data()) == plain

    monkeypatch.setenv("GPUDASH_CACHE_DIR", "off")
    assert bundle(create_app(runs_dir)).status_code == 200
    monkeypatch.setenv("GPUDASH_CACHE_DIR", str(tmp_path / "cache"))  # the folder is as the first app left it
    assert len(list((tmp_path / "cache" / "bundles").iterdir())) == 1
