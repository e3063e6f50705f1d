"""The standalone /metrics server: the same exposure rules as ``gpudash serve`` (token beyond
loopback, Host check) and the same run-id resolution (no symlinks out of the runs folder)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpudash.errors import UserError
from gpudash.server.metrics import MetricsServer, main, metrics_registry, serve_metrics


def _get(url: str, **headers: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _runs_seen(text: str) -> set[str]:
    return {s.labels["run"] for fam in text_string_to_metric_families(text) for s in fam.samples
            if "run" in s.labels}


@pytest.fixture
def runs(tmp_path: Path, train_tiny: Callable[..., Any]) -> Path:
    tiny_loop = train_tiny
    root = tmp_path
    runs = root / "runs"
    tiny_loop(runs / "good", steps=3, host_hz=0, handle_signals=False)
    tiny_loop(root / "outside" / "secret", steps=3, host_hz=0, handle_signals=False)
    tiny_loop(root / "outside2" / "secret2", steps=3, host_hz=0, handle_signals=False)
    (runs / "escape").symlink_to(root / "outside" / "secret")       # a run folder linking out
    (runs / "group").symlink_to(root / "outside2")                  # a group folder linking out
    (runs / "team").mkdir()
    (runs / "team" / "escape").symlink_to(root / "outside" / "secret")  # nested link out
    (runs / "linked").mkdir()                                       # a rank file linking out
    for f in (root / "outside" / "secret").iterdir():
        (runs / "linked" / f.name).symlink_to(f)
    return runs


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUDASH_TOKEN", raising=False)


@pytest.fixture
def serve(runs: Path) -> Iterator[Callable[..., str]]:
    servers: list[Any] = []

    def start(**kwargs: Any) -> str:
        server = serve_metrics(runs, port=0, **kwargs)
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/metrics"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def test_exposed_bind_needs_a_token(runs: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match="--token"):
        serve_metrics(runs, port=0, host="0.0.0.0")
    with pytest.raises(UserError, match="--token"):
        MetricsServer(port=0, host="0.0.0.0")
    assert main([str(runs), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--token" in err and "Traceback" not in err
    MetricsServer(port=0, host="0.0.0.0", token="t" * 16)  # allowed with a token
    monkeypatch.setenv("GPUDASH_TOKEN", "from-env-0123456789")
    assert MetricsServer(port=0, host="0.0.0.0").token == "from-env-0123456789"


def test_token_checked_on_every_scrape(serve: Callable[..., str]) -> None:
    url = serve(token="s3cret-s3cret-s3cret")
    assert _get(url)[0] == 401
    assert _get(url, Authorization="Bearer wrong")[0] == 401
    status, text = _get(url, Authorization="Bearer s3cret-s3cret-s3cret")  # Prometheus: authorization: {credentials: s3cret-s3cret-s3cret}
    assert status == 200 and "good" in _runs_seen(text)
    assert _get(url + "?token=s3cret-s3cret-s3cret")[0] == 200


def test_foreign_host_header_refused(serve: Callable[..., str]) -> None:
    url = serve()
    port = url.split(":")[2].split("/")[0]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        status, body = _get(url, Host=host)
        assert status == 403 and "evil.example" in body and body.count("\n") == 1, host
    assert _get(url, Host="bad host")[0] == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]:9", "LOCALHOST"):
        assert _get(url, Host=host)[0] == 200, host
    allowed = serve(allow_hosts=["metrics.example.org"])
    assert _get(allowed, Host="metrics.example.org:443")[0] == 200


def test_no_symlinks_out_of_the_runs_folder(runs: Path, serve: Callable[..., str]) -> None:
    status, text = _get(serve())
    assert status == 200
    assert _runs_seen(text) == {"good"}
    # the registry used by the dashboard's /metrics route resolves the same way
    from prometheus_client import generate_latest

    assert _runs_seen(generate_latest(metrics_registry(runs)).decode()) == {"good"}


def test_monitor_exporter_with_token(tmp_path: Path, train_tiny: Callable[..., Any]) -> None:
    tiny_loop = train_tiny
    exporter = MetricsServer(port=0, token="tok-0123456789abcdef")
    mon = tiny_loop(tmp_path / "self", steps=2, close=False, host_hz=0, handle_signals=False)
    try:
        mon.add_collector(exporter)
        assert mon.flush() and exporter.url is not None
        assert _get(exporter.url)[0] == 401
        status, text = _get(exporter.url, Authorization="Bearer tok-0123456789abcdef")
        assert status == 200 and _runs_seen(text) == {"self"}
    finally:
        mon.close()


def test_weak_tokens_refused(runs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A single space or a short word guards nothing: refused in one line, from the flag and the environment."""
    for weak in (" ", "   \t", "short-token"):
        with pytest.raises(UserError, match="characters|whitespace"):
            MetricsServer(port=0, host="0.0.0.0", token=weak)
        assert main([str(runs), "--host", "0.0.0.0", "--port", "0", "--token", weak]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and "short-token" not in err, err
    monkeypatch.setenv("GPUDASH_TOKEN", " ")
    with pytest.raises(UserError, match="GPUDASH_TOKEN"):
        MetricsServer(port=0, host="0.0.0.0")


def test_security_headers(serve: Callable[..., str]) -> None:
    """No Referer leaves a page whose URL may carry the token; only local pages and the own origin may frame it."""
    url = serve()
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        csp = resp.headers["Content-Security-Policy"]
    assert csp.startswith("frame-ancestors ") and "'self'" in csp and "http://127.0.0.1:*" in csp
    status, _ = _get(url, Host="evil.example")  # refusals carry them too
    assert status == 403
