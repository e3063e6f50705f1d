"""The server: JSON API, token check on every route, bind rules, pages by URL."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import plotly
import pytest

from gpudash.cli import main
from gpudash.errors import UserError
from gpudash.server.app import create_app, serve_in_thread
from gpudash.server.layouts.callbacks import ReaderCache, page_for
from gpudash.server.layouts.viewstate import zoom_range


def test_api_runs_and_summary(runs_dir: Path) -> None:
    client = create_app(runs_dir).server.test_client()
    r = client.get("/api/runs")
    assert r.status_code == 200
    ids = [x["id"] for x in r.json["runs"]]
    assert ids == ["plain", "rich"]
    s = client.get("/api/runs/rich/summary")
    assert s.status_code == 200
    body = s.json
    assert body["steps"] == 40 and body["status"] == "finished"
    assert body["events"]["oom"] == 1
    assert body["throughput"]["median_s"] > 0
    assert {x["signal"] for x in body["stability"]} >= {"OOMs", "loss spikes"}
    assert body["verdicts"] is None or isinstance(body["verdicts"], list)


def test_api_runs_is_paged(runs_dir: Path) -> None:
    """/api/runs pages like the runs page (newest first, search before paging), so thousands of runs answer
    without summarising every one."""
    client = create_app(runs_dir).server.test_client()
    everything = client.get("/api/runs").json
    assert everything["total"] == 2 and everything["pages"] == 1
    first = client.get("/api/runs?per_page=1").json
    second = client.get("/api/runs?per_page=1&page=1").json
    assert first["pages"] == 2 and len(first["runs"]) == 1 and len(second["runs"]) == 1
    assert [first["runs"][0]["id"], second["runs"][0]["id"]] == [r["id"] for r in everything["runs"]]
    found = client.get("/api/runs?q=plain").json
    assert [r["id"] for r in found["runs"]] == ["plain"] and found["matching"] == 1
    for bad in ("page=x", "per_page=0", "per_page=100000", "page=-1", "status=bogus"):
        r = client.get(f"/api/runs?{bad}")
        assert r.status_code == 400 and "error" in r.json, bad


@pytest.mark.parametrize("bad", ["nope", "..", "%2e%2e", "..%2f..%2fetc", "%2Fetc"])
def test_api_bad_run_ids(runs_dir: Path, bad: str) -> None:
    client = create_app(runs_dir).server.test_client()
    r = client.get(f"/api/runs/{bad}/summary")
    assert r.status_code == 404
    assert "rank" not in r.get_data(as_text=True)


def test_token_required_everywhere(runs_dir: Path) -> None:
    app = create_app(runs_dir, token="s3cret")
    client = app.server.test_client()
    for path in ("/", "/run/rich", "/api/runs", "/api/runs/rich/summary", "/_dash-layout", "/_dash-dependencies"):
        assert client.get(path).status_code == 401, path
    assert client.post("/_dash-update-component", json={}).status_code == 401
    assert client.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/api/runs?token=s3cret").status_code == 200
    r = client.get("/run/rich?token=s3cret")
    assert r.status_code == 302 and r.headers["Location"].endswith("/run/rich")
    assert "gpudash_token=s3cret" in r.headers["Set-Cookie"] and "HttpOnly" in r.headers["Set-Cookie"]
    client.set_cookie("gpudash_token", "s3cret")
    assert client.get("/run/rich").status_code == 200
    assert client.get("/_dash-layout").status_code == 200


def test_no_token_on_loopback(runs_dir: Path) -> None:
    assert create_app(runs_dir).server.test_client().get("/").status_code == 200


def test_bind_rules(runs_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUDASH_TOKEN", raising=False)
    with pytest.raises(UserError, match="--token"):
        serve_in_thread(runs_dir, "0.0.0.0", 0)
    assert main(["serve", str(runs_dir), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--token" in err
    assert main(["serve", str(runs_dir / "missing")]) == 2


def test_serve_in_thread(runs_dir: Path) -> None:
    import sys
    import threading

    from gpudash.server.runcache import shared_cache

    switch = sys.getswitchinterval()
    shared_cache().clear()
    url, stop = serve_in_thread(runs_dir, "127.0.0.1", 0, token="tok", head_start=True)
    try:
        for t in [t for t in threading.enumerate() if t.name == "gpudash-warm"]:
            t.join(60)
        # the head start after the address is printed: the newest run is read, the interpreter set back
        newest = max((runs_dir / r for r in ("plain", "rich")), key=lambda p: p.stat().st_mtime)
        assert shared_cache().current(newest) is not None
        assert sys.getswitchinterval() == switch
        assert url.endswith("/?token=tok")
        base = url.split("?")[0]
        req = urllib.request.Request(base + "api/runs", headers={"Authorization": "Bearer tok"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert [r["id"] for r in json.load(resp)["runs"]] == ["plain", "rich"]
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(base + "api/runs", timeout=10)
        assert exc.value.code == 401
    finally:
        stop()


def test_no_head_start_in_a_host_process(runs_dir: Path) -> None:
    """A dashboard served inside another program (the demo's trainer, a notebook's kernel) reads no run and
    leaves the interpreter's settings alone until a browser asks."""
    import threading

    from gpudash.server.runcache import shared_cache

    shared_cache().clear()
    url, stop = serve_in_thread(runs_dir, "127.0.0.1", 0)
    try:
        for t in [t for t in threading.enumerate() if t.name == "gpudash-warm"]:
            t.join(60)
        assert all(shared_cache().current(runs_dir / r) is None for r in ("plain", "rich"))
    finally:
        stop()


def test_pages_by_url(runs_dir: Path) -> None:
    readers = ReaderCache(runs_dir)

    def text(page) -> str:  # type: ignore[no-untyped-def]
        return json.dumps(page, cls=plotly.utils.PlotlyJSONEncoder)

    assert "runs-table" in text(page_for("/", "", runs_dir, readers))
    run = text(page_for("/run/rich", "", runs_dir, readers))
    for view in ("memory-view", "throughput-view", "device-view", "stability-view", "events-view", "hotspots-view",
                 "last-step", "summary-panel", "cursor-slider"):
        assert view in run
    assert "not-found" in text(page_for("/run/..", "", runs_dir, readers))
    assert "not-found" in text(page_for("/run/%2e%2e", "", runs_dir, readers))
    cmp = text(page_for("/compare", "?runs=rich,plain,nope", runs_dir, readers))
    assert "compare-table" in cmp and "not found: nope" in cmp


def test_zoom_payloads() -> None:
    assert zoom_range(None) is None
    assert zoom_range({"xaxis.range[0]": 10, "xaxis.range[1]": 20.5}) == (10.0, 20.5)
    assert zoom_range({"xaxis.range": [1, 2]}) == (1.0, 2.0)
    assert zoom_range({"xaxis.autorange": True}) is True
    assert zoom_range({"yaxis.range[0]": 1, "yaxis.range[1]": 2}) is None


def test_layouts_never_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, gpudash.server.app, gpudash.server.layouts.pages, gpudash.server.layouts.compare; "
            "assert 'torch' not in sys.modules, 'dashboard imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
