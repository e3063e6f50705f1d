"""The dashboard server answers only requests that name it (DNS rebinding), and the rule is the
one :mod:`gpudash.server.access` holds for every gpudash server."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpudash.server.access import allowed_hosts, host_name
from gpudash.server.app import create_app, serve_in_thread

CALLBACK = {"output": "..page.children...shown-page.data..",
            "outputs": [{"id": "page", "property": "children"}, {"id": "shown-page", "property": "data"}],
            "inputs": [{"id": "url", "property": "pathname", "value": "/"},
                       {"id": "url", "property": "search", "value": ""}],
            "changedPropIds": ["url.pathname"], "state": [{"id": "shown-page", "property": "data", "value": None}]}


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8050", "localhost.evil.example",
                                  "127.0.0.1.nip.io:80"])
def test_foreign_host_refused(runs_dir: Path, host: str) -> None:
    client = create_app(runs_dir).server.test_client()
    for r in (client.get("/api/runs", headers={"Host": host}), client.get("/", headers={"Host": host}),
              client.post("/_dash-update-component", json=CALLBACK, headers={"Host": host})):
        assert r.status_code == 403
        body = r.get_data(as_text=True)
        assert body.count("\n") == 1 and "rebinding" in body and "runs" not in body


@pytest.mark.parametrize("host", ["localhost", "localhost:8050", "127.0.0.1:1", "[::1]:8050", "[::1]",
                                  "LocalHost.", "127.0.0.2:80"])
def test_loopback_names_answered(runs_dir: Path, host: str) -> None:
    client = create_app(runs_dir).server.test_client()
    assert client.get("/api/runs", headers={"Host": host}).status_code == 200
    r = client.post("/_dash-update-component", json=CALLBACK, headers={"Host": host})
    assert r.status_code == 200 and "runs-table" in r.get_data(as_text=True)


@pytest.mark.parametrize("host", ["a b", "[::1", "[::1]x", "localhost:http", "user@localhost"])
def test_malformed_host_is_a_bad_request(runs_dir: Path, host: str) -> None:
    r = create_app(runs_dir).server.test_client().get("/api/runs", headers={"Host": host})
    assert r.status_code == 400


def test_exposed_server_answers_its_configured_names(runs_dir: Path) -> None:
    app = create_app(runs_dir, token="tok", host="10.1.2.3", allow_hosts=["dash.example.org"])
    client = app.server.test_client()
    auth = {"Authorization": "Bearer tok"}
    for host in ("10.1.2.3:8050", "dash.example.org", "localhost:8050"):
        assert client.get("/api/runs", headers={"Host": host, **auth}).status_code == 200, host
    assert client.get("/api/runs", headers={"Host": "evil.example", **auth}).status_code == 403
    assert client.get("/api/runs", headers={"Host": "10.1.2.3"}).status_code == 401  # the token still holds
    anyhost = create_app(runs_dir, token="tok", host="10.1.2.3", allow_hosts=["*"]).server.test_client()
    assert anyhost.get("/api/runs", headers={"Host": "whatever.example", **auth}).status_code == 200


def test_wildcard_bind_answers_this_machines_names() -> None:
    import socket

    names = allowed_hosts("0.0.0.0")
    assert socket.gethostname().lower() in names and "localhost" in names
    assert "evil.example" not in names
    assert allowed_hosts("127.0.0.1") == frozenset({"localhost", "127.0.0.1", "::1"})


def test_host_name_parsing() -> None:
    assert host_name("Example.ORG:80") == "example.org"
    assert host_name("[::1]:8050") == "::1"
    assert host_name("evil.example.") == "evil.example"
    assert host_name("x:y") is None and host_name("") is None


def test_real_server_refuses_foreign_host(runs_dir: Path) -> None:
    url, stop = serve_in_thread(runs_dir, "127.0.0.1", 0)
    try:
        req = urllib.request.Request(url + "api/runs", headers={"Host": "rebind.evil.example"})
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=10)
        assert exc.value.code == 403
        with urllib.request.urlopen(url + "api/runs", timeout=10) as resp:
            assert resp.status == 200
    finally:
        stop()
