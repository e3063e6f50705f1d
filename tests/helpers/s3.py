"""A real S3 protocol server for tests: moto's standalone server (real HTTP) with s3fs as the client, configured
only through the environment (AWS_ENDPOINT_URL, AWS_*), as a user would. Import ``s3`` into a test module."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudash.store import mirror, publish, sharedfs
from gpudash.store.objstore import open_store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """An S3 endpoint on a free port; yields its URL, with the environment pointing at it."""
    pytest.importorskip("s3fs", reason="object-store tests need s3fs (pip install 'gpudash[s3]')")
    moto_server = pytest.importorskip("moto.server", reason="object-store tests need moto[server] (dev extra)")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import urllib.request

    # moto keeps its buckets in the process, across servers: every test starts from an empty store
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(sharedfs.LOCAL_DIR_ENV, str(tmp_path / "local"))
    monkeypatch.setattr(publish, "PUBLISH_INTERVAL_S", 0.0)
    monkeypatch.setattr(publish, "RETRY_S", 0.1)
    monkeypatch.setattr(mirror, "SYNC_S", 0.0)
    try:
        yield endpoint
    finally:
        server.stop()


def bucket(name: str) -> None:
    open_store(f"s3://{name}").fs.mkdir(name)


def record_run(url: str, steps: int) -> None:
    """A small run recorded straight into ``url`` (a store URL), one loss a step."""
    from gpudash.monitor import Monitor

    with Monitor(url, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        for i in range(steps):
            with mon.step(samples=4):
                mon.log(loss=1.0 / (i + 1))


def copy_run(src: str, dest: str) -> None:
    """Every object of the run at ``src`` put under ``dest`` (a run copied inside a bucket)."""
    store = open_store(src)
    for name in store.find(""):
        open_store(dest).put(name, store.get(name))


def forget_served() -> None:
    """What a server process keeps of the runs it listed and opened, forgotten (a fresh server)."""
    from gpudash.server.layouts import runs as page
    from gpudash.server.runcache import shared_cache
    from gpudash.store import runsync

    page._CACHE.clear()
    page._ENTRIES.clear()
    shared_cache().clear()
    runsync.close_mirrors()
