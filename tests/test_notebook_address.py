"""Which address ``gpudash.show`` gives the browser, and what the server behind a proxy path answers."""

from __future__ import annotations

import http.client
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gpudash.errors import UserError
from gpudash.server import notebook


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.delenv(notebook.PROXY_ENV, raising=False)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    yield
    notebook.shutdown()


@pytest.mark.parametrize(("spec", "template"), [
    ("/user/alice/", "/user/alice/proxy/{port}/"),
    ("/user/alice", "/user/alice/proxy/{port}/"),
    ("/", "/proxy/{port}/"),
    ("/lab/custom/{port}", "/lab/custom/{port}/"),
    ("https://hub.example.org/user/bob/", "https://hub.example.org/user/bob/proxy/{port}/"),
    ("off", None), ("", None), ("none", None),
])
def test_proxy_spec(spec: str, template: str | None) -> None:
    assert notebook.proxy_template(spec) == template


@pytest.mark.parametrize("spec", ["user/alice", "hub.example.org/user/", "ftp://x/", "/user/a/?x=1"])
def test_bad_proxy_spec_is_one_line(spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="base URL path"):
        notebook.proxy_template(spec)
    monkeypatch.setenv(notebook.PROXY_ENV, spec)
    with pytest.raises(UserError, match=notebook.PROXY_ENV):
        notebook.proxy_template(None)


def test_environment_override_and_plain_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    assert notebook.proxy_template(None) is None  # not in a kernel: the browser is on this machine
    assert notebook.proxy_template(False) is None
    monkeypatch.setenv(notebook.PROXY_ENV, "/user/carol/")
    assert notebook.proxy_template(None) == "/user/carol/proxy/{port}/"
    assert notebook.proxy_template(False) is None  # the argument wins
    with pytest.raises(UserError, match="jupyter-server-proxy"):
        monkeypatch.delenv(notebook.PROXY_ENV)
        monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX")
        notebook.proxy_template(True)  # asked for, but no Jupyter server runs this process


def _get(url: str, host: str | None = None, cookie: str = "", **extra: str) -> http.client.HTTPResponse:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    headers = {k.replace("_", "-"): v for k, v in extra.items()} | ({"Cookie": cookie} if cookie else {})
    if host:
        headers["Host"] = host
    conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
    return conn.getresponse()


def test_proxied_server_needs_its_token_and_answers_under_the_prefix(tmp_path: Path, train_tiny: object) -> None:
    train_tiny(tmp_path / "runs" / "a", steps=3, host_hz=0, handle_signals=False)  # type: ignore[operator]
    url = notebook.dashboard_url(tmp_path / "runs" / "a", proxy="/user/alice/")
    path, _, query = url.partition("?")
    port = int(path.split("/proxy/")[1].split("/")[0])
    assert path == f"/user/alice/proxy/{port}/run/a" and query.startswith("token=")
    local = notebook.local_url(tmp_path / "runs" / "a", proxy="/user/alice/")
    assert local == f"http://127.0.0.1:{port}{url}"  # the same page by SSH port-forward
    assert notebook.dashboard_url(tmp_path / "runs" / "a") != url  # loopback is a server of its own
    root = f"http://127.0.0.1:{port}"

    # what jupyter-server-proxy forwards: the prefix stripped, the browser's Host (the hub's name)
    assert _get(f"{root}/run/a", host="hub.example.org").status == 401  # no token: nothing
    first = _get(f"{root}/run/a?{query}", host="hub.example.org")
    assert first.status == 302 and first.getheader("Location") == "/run/a"
    cookie = first.getheader("Set-Cookie") or ""
    assert "Path=/;" in cookie or cookie.endswith("Path=/")
    page = _get(f"{root}/run/a", host="hub.example.org", cookie=cookie.split(";")[0])
    body = page.read().decode()
    assert page.status == 200 and f'src="/user/alice/proxy/{port}/_dash-component-suites/' in body  # assets via proxy
    assert f"<a href='/user/alice/proxy/{port}/'>gpudash</a>" in body  # the top bar stays inside the proxy

    # opened directly (SSH forward): under the prefix, the cookie scoped to it
    direct = _get(local)
    assert direct.status == 302 and direct.getheader("Location") == path
    assert f"Path=/user/alice/proxy/{port}/" in (direct.getheader("Set-Cookie") or "")
    asset = _get(f"{root}/user/alice/proxy/{port}/_dash-layout", cookie=(direct.getheader("Set-Cookie") or "")
                 .split(";")[0])
    assert asset.status == 200

    # a proxy that says where it mounts the server scopes the cookie there (two kernels, one hub)
    scoped = _get(f"{root}/run/a?{query}", host="hub.example.org", X_Forwarded_Prefix=f"/user/alice/proxy/{port}")
    assert f"Path=/user/alice/proxy/{port}/" in (scoped.getheader("Set-Cookie") or "")
    odd = _get(f"{root}/run/a?{query}", X_Forwarded_Prefix="/x; Domain=evil.example")
    assert "evil" not in (odd.getheader("Set-Cookie") or "")


def test_show_outside_ipython_prints_the_loopback_url(tmp_path: Path, train_tiny: object,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    train_tiny(tmp_path / "runs" / "a", steps=3, host_hz=0, handle_signals=False)  # type: ignore[operator]
    url = notebook.show(tmp_path / "runs" / "a")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/run/a")
    assert url in capsys.readouterr().out


def test_embed_has_the_iframe_and_the_ssh_line() -> None:
    html = notebook._embed("/user/a/proxy/8123/run/x?token=t&u", "http://127.0.0.1:8123/user/a/proxy/8123/run/x",
                           8123, 500)
    assert '<iframe src="/user/a/proxy/8123/run/x?token=t&amp;u"' in html and 'height="500"' in html
    assert "not reachable?" in html and "ssh -L 8123:127.0.0.1:8123 " in html
    assert 'href="http://127.0.0.1:8123/user/a/proxy/8123/run/x"' in html


@pytest.mark.parametrize(("status", "hub", "expected"), [
    (200, None, "/user/alice/proxy/{port}/"),       # the server has jupyter-server-proxy
    (404, None, None),                               # it has not: loopback
    (404, "/user/alice/", None),                     # not even on a hub
    (403, "/user/alice/", "/user/alice/proxy/{port}/"),  # a hub's login in the way: hubs ship the proxy
    (403, None, None),
    (None, "/user/bob/", "/user/bob/proxy/{port}/"),  # no server found for the kernel, on a hub
    (None, None, None),
])
def test_inferred_from_the_jupyter_server_of_this_kernel(status: int | None, hub: str | None, expected: str | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Jupyter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(f"{self.path} {self.headers.get('Authorization')}")
            self.send_response(status or 500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    fake = ThreadingHTTPServer(("127.0.0.1", 0), Jupyter)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    try:
        info = {"url": f"http://127.0.0.1:{fake.server_port}/user/alice/", "base_url": "/user/alice/", "token": "jt"}
        monkeypatch.setattr(notebook, "_in_kernel", lambda: True)
        monkeypatch.setattr(notebook, "_jupyter_server", lambda: info if status else None)
        if hub:
            monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", hub)
        assert notebook.proxy_template(None) == expected
        if status:
            assert seen == ["/user/alice/server-proxy/servers-info token jt"]
        if expected is None:
            with pytest.raises(UserError, match="proxy='/user/NAME/'"):
                notebook.proxy_template(True)
    finally:
        fake.shutdown()
        fake.server_close()
