"""One bad run or object never takes down what others share (issue 44, item 5): a run whose node name is
not valid UTF-8 is ``gpudash_run_damaged`` on ``/metrics`` while the others are served; the S3 mirror names
an object it cannot read and copies the rest; it serves only the prefix asked for (a ``run.json`` planted at
its root is no reason to serve the bucket root); a ``run.json`` too large to read is named, not hidden; and
the first listing of a big prefix runs in the background (the server binds its port at once)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest
from helpers.hostile_cases import healthy
from prometheus_client import generate_latest

from gpudash.commands import serve
from gpudash.server.metrics import metrics_registry
from gpudash.server.runcache import shared_cache
from gpudash.store import load_run
from gpudash.store.listed import listed_run
from gpudash.store.runid import list_run_dirs
from gpudash.store.runsync import RunsMirror


def test_a_lone_surrogate_node_name_damages_its_run_not_the_scrape(tmp_path: Path) -> None:
    shared_cache().clear()
    runs = tmp_path / "runs"
    healthy(runs / "good")
    bad = healthy(runs / "bad")
    with sqlite3.connect(bad / "rank0.db") as c:  # JSON may carry it (\udcff); UTF-8 cannot
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('node', ?)", (json.dumps("gpu-\udcff\u001b[2J"),))
    c.close()
    text = generate_latest(metrics_registry(runs, facts=False)).decode()
    assert 'run="good"' in text and 'gpudash_step{node=' in text
    assert ('gpudash_run_damaged{problem="a recorded node is not valid UTF-8 text; shown escaped",run="bad"} 1.0'
            in text)


def _bucket() -> str:
    return f"memory://b{uuid.uuid4().hex[:8]}"


def _put(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, data)


def _run_objects(prefix: str, run: str, extra: dict[str, Any] | None = None) -> None:
    _put(f"{prefix}/{run}/run.json", json.dumps({"name": run, **(extra or {})}).encode())
    _put(f"{prefix}/{run}/segments/rank=0/meta.json", json.dumps({"name": run}).encode())


def test_an_object_the_mirror_cannot_read_is_named_and_the_rest_copied(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"{_bucket()}/runs"
    for run in ("a", "b", "c"):
        _run_objects(prefix, run)
    mirror = RunsMirror(prefix, tmp_path / "local")
    real_get = mirror.store.get

    def get(name: str, limit: int = 1 << 40, size: int | None = None) -> bytes:
        if name == "a/run.json":  # sorted first: an archived object (InvalidObjectState) today stops all
            raise PermissionError("InvalidObjectState: the object is archived")
        return real_get(name, limit, size)

    monkeypatch.setattr(mirror.store, "get", get)
    assert mirror.sync_once() == 5
    c, a = listed_run(tmp_path / "local" / "c"), listed_run(tmp_path / "local" / "a")
    assert c is not None and c.run_json is not None and a is not None and a.run_json is None  # a: listed all the same
    assert [e for e in mirror.errors if "runs/a/run.json" in e and "archived" in e], mirror.errors
    assert mirror.sync_once() == 0 and len(mirror.errors) == 1  # retried every time, said once


def test_the_prefix_served_is_the_one_asked_for(tmp_path: Path) -> None:
    bucket = _bucket()
    _run_objects(f"{bucket}/runs", "good")
    _put(f"{bucket}/runs/run.json", b'{"name": "planted"}')  # at the prefix's root
    _run_objects(f"{bucket}/private", "secret")  # beside the prefix, not under it
    _run_objects(bucket, "toplevel")
    mirror = serve._mirror(f"{bucket}/runs")
    try:
        assert mirror.store.location == f"{bucket}/runs"
        for _ in range(200):
            if listed_run(mirror.local / "good") is not None:
                break
            time.sleep(0.05)
        listed = {run_id for run_id, _path in list_run_dirs(mirror.local)}
        mirror.stop()
        assert "good" in listed
        assert not [p for p in listed if "secret" in p or "toplevel" in p or "private" in p], listed
    finally:
        mirror.stop()


def test_a_run_json_too_large_is_named_not_hidden(tmp_path: Path) -> None:
    prefix = f"{_bucket()}/runs"
    _run_objects(prefix, "fat5", {"pad": "x" * (5 << 20)})  # over the 4 MiB the mirror copied: read now
    _run_objects(prefix, "fat9", {"pad": "x" * (9 << 20)})  # over what any reader reads: named
    _run_objects(prefix, "good")
    _put(f"{prefix}/good/segments/rank=0/meta.json", json.dumps({"pad": "x" * (5 << 20)}).encode())
    mirror = RunsMirror(prefix, tmp_path / "local")
    mirror.sync_once()
    assert [e for e in mirror.errors if "fat9/run.json" in e and "not copied" in e], mirror.errors
    assert [e for e in mirror.errors if "good/segments/rank=0/meta.json" in e and "not copied" in e], mirror.errors
    r = load_run(tmp_path / "local" / "good")
    try:
        # read from the store when the run is opened (the listing copies no more than the metadata it can read)
        assert [p for p in r.problems if "meta.json is 5,242,891 bytes, over the" in p], r.problems
    finally:
        r.close()
    r = load_run(tmp_path / "local" / "fat5")
    try:
        assert r.name == "fat5" and not [p for p in r.problems if "run.json" in p]
    finally:
        r.close()
    r = load_run(tmp_path / "local" / "fat9")
    try:
        assert [p for p in r.problems if p.startswith("run.json: run.json is 9.0 MiB, over the")], r.problems
    finally:
        r.close()


def test_the_first_listing_runs_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"{_bucket()}/runs"
    _run_objects(prefix, "good")
    mirror = RunsMirror(prefix, tmp_path / "local")
    release, listed = threading.Event(), threading.Event()
    real_find = mirror.store.fs.find

    def slow_find(*args: Any, **kwargs: Any) -> Any:  # 20k unrelated objects: a listing that takes long
        release.wait(30)
        out = real_find(*args, **kwargs)
        listed.set()
        return out

    monkeypatch.setattr(mirror.store.fs, "find", slow_find)
    mirror.start()  # returns while the listing is still under way: the caller binds its port meanwhile
    try:
        assert not listed.is_set()
        release.set()
        assert listed.wait(30)
        for _ in range(200):
            if listed_run(tmp_path / "local" / "good") is not None:
                break
            time.sleep(0.05)
        assert listed_run(tmp_path / "local" / "good") is not None
    finally:
        release.set()
        mirror.stop()
