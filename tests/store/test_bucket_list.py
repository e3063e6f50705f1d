"""A folder of runs in an object store (issue 45): listed from each run's metadata alone (no segment read or
copied), a run's segments fetched when it is opened, into a bounded cache shared by its readers."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="object-store tests need s3fs (pip install 'gpudash[s3]')")
pytest.importorskip("moto.server", reason="object-store tests need moto[server] (dev extra)")

from helpers.s3 import bucket as _bucket
from helpers.s3 import copy_run, forget_served, record_run

from gpudash import load_run
from gpudash.server.layouts import runs as page
from gpudash.store import mirror as mirror_mod
from gpudash.store import runsync
from gpudash.store.objstore import open_store
from gpudash.store.runsync import RunsMirror, origin_of


def _gets(store_fs: object, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every object read whole through the store's filesystem (one instance per set of options in fsspec:
    the listing's and each opened run's store share it)."""
    seen: list[str] = []
    real = store_fs.cat_file  # type: ignore[attr-defined]
    real_async = store_fs._cat_file  # type: ignore[attr-defined]  # s3fs's batched reads (the listing's)

    def cat_file(path: str, *a: object, **k: object) -> object:
        seen.append(str(path))
        return real(path, *a, **k)

    async def cat_file_async(path: str, *a: object, **k: object) -> object:
        seen.append(str(path))
        return await real_async(path, *a, **k)

    monkeypatch.setattr(store_fs, "cat_file", cat_file)
    monkeypatch.setattr(store_fs, "_cat_file", cat_file_async)
    return seen


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    forget_served()
    yield
    forget_served()


def test_a_bucket_is_listed_from_metadata_and_a_run_opened_on_demand(s3: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _bucket("runs")
    record_run("s3://runs/team/a", 7)
    copy_run("s3://runs/team/a", "s3://runs/team/b")
    mirror = RunsMirror("s3://runs/team", tmp_path / "local")
    gets = _gets(mirror.store.fs, monkeypatch)
    # one object per run: its meta.json, which carries its run.json's copy (nothing else, no segment)
    assert mirror.sync_once() == 2
    assert len(gets) == 2 and all(g.endswith("/segments/rank=0/meta.json") for g in gets), gets
    assert list(mirror.local.iterdir()) == []  # listed in memory: nothing on local disk before a run is opened
    assert origin_of(mirror.local / "a") == "s3://runs/team/a" and origin_of(tmp_path) is None

    listing = page.list_page(mirror.local)
    assert listing.matching == 2 and {r["id"] for r in listing.rows} == {"a", "b"}
    row = next(r for r in listing.rows if r["id"] == "a")
    assert not [g for g in gets if g.endswith(".parquet")], gets  # listed: still no segment read
    assert row["status"] == "finished" and row["steps"] == 7 and row["ranks"] == 1 and row["problems"] == []
    assert page.list_page(mirror.local, status="finished").matching == 2  # the filter reads the same metadata
    assert page.list_page(mirror.local, query="b").matching == 1
    assert mirror.sync_once() == 0  # nothing changed: nothing fetched again
    assert list(mirror.local.iterdir()) == []  # the list read: still nothing on disk

    # opened: its segments are fetched now, and the loaded run's facts say what its row said
    opened = page.run_summary("a", mirror.local / "a")
    assert [g for g in gets if "/team/a/segments/" in g and g.endswith(".parquet")]
    assert not [g for g in gets if "/team/b/segments/" in g and g.endswith(".parquet")]
    for key in ("status", "steps", "ranks", "peak_bytes", "name", "started"):
        assert opened[key] == row[key], key
    # the opened run's folder only (and the segment cache, a hidden folder beside it)
    assert [p.name for p in mirror.local.iterdir() if not p.name.startswith(".")] == ["a"]
    assert opened["duration_s"] == pytest.approx(row["duration_s"])
    run = load_run(mirror.local / "b")
    try:
        assert run.steps["step"].tolist() == list(range(7)) and run.status == "finished"
    finally:
        run.close()
    store = open_store("s3://runs/team/b")
    for name in store.find(""):  # deleted from the bucket: gone from the list at the next listing
        store.remove(name)
    mirror.sync_once()
    assert [r["id"] for r in page.list_page(mirror.local).rows] == ["a"] and not (mirror.local / "b").exists()


def test_a_run_published_before_the_listing_existed_is_listed(s3: str, tmp_path: Path) -> None:
    _bucket("runs")
    store = open_store("s3://runs/old")
    store.put("r1/run.json", json.dumps({"name": "r1", "created_at": 1000.0}).encode())
    store.put("r1/segments/rank=0/meta.json", json.dumps({"status": "finished", "last_step": 41,
                                                          "started_at": 1000.0, "segments": True}).encode())
    store.put("r2/segments/rank=0/meta.json", b"not json")  # damaged: listed, said
    mirror = RunsMirror("s3://runs/old", tmp_path / "local")
    mirror.sync_once()
    rows = {r["id"]: r for r in page.list_page(mirror.local).rows}
    assert rows["r1"]["status"] == "finished" and rows["r1"]["steps"] == 42 and rows["r1"]["peak_bytes"] is None
    assert rows["r2"]["status"] == "crashed" and [p for p in rows["r2"]["problems"] if "meta.json" in p]


def test_opened_runs_share_one_bounded_segment_cache(s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _bucket("runs")
    record_run("s3://runs/team/a", 3)
    copy_run("s3://runs/team/a", "s3://runs/team/b")
    monkeypatch.setattr(mirror_mod, "OPEN_RUNS", 1)
    mirror = RunsMirror("s3://runs/team", tmp_path / "local")
    mirror.sync_once()
    first = load_run(mirror.local / "a")
    again = load_run(mirror.local / "a")
    held = runsync.open_mirrors()
    assert len(held) == 1 and held[0].store.location == "s3://runs/team/a" and held[0].disk_bytes() > 0
    folder = held[0].folder
    again.close()
    assert folder.is_dir()  # a reader closing never removes what another reader of the run reads
    other = load_run(mirror.local / "b")  # over the bound: the least recently opened run's files go
    try:
        assert [m.store.location for m in runsync.open_mirrors()] == ["s3://runs/team/b"]
        assert not folder.exists()
        assert other.steps["step"].tolist() == [0, 1, 2]
        assert first.steps["step"].tolist() == [0, 1, 2]  # read at load: still there
    finally:
        first.close()
        other.close()


def _meta(store_url: str, run: str, **meta: object) -> None:
    open_store(store_url).put(f"{run}/segments/rank=0/meta.json", json.dumps(meta).encode())


def _made_live(url: str) -> None:
    """The finished run at ``url`` as a live one: its meta says live, its heartbeat fresh (this process)."""
    store = open_store(url)
    meta = json.loads(store.get("segments/rank=0/meta.json"))
    meta.update(status="live", heartbeat=time.time(), pid=os.getpid(), host=socket.gethostname())
    meta.pop("ended_at", None)
    store.put("segments/rank=0/meta.json", json.dumps(meta).encode())


def test_new_and_finished_runs_appear_on_the_next_listing_and_live_follows_the_heartbeat(s3: str,
                                                                                        tmp_path: Path) -> None:
    _bucket("runs")
    url = "s3://runs/flow"
    now = time.time()
    open_store(url).put("r1/run.json", json.dumps({"name": "r1", "created_at": now - 60}).encode())
    _meta(url, "r1", status="live", heartbeat=now, started_at=now - 60, last_step=3, pid=os.getpid(),
          host=socket.gethostname())
    _meta(url, "stale", status="live", heartbeat=now - 3600, started_at=now - 4000, last_step=9)
    mirror = RunsMirror(url, tmp_path / "local")
    mirror.sync_once()
    rows = {r["id"]: r for r in page.list_page(mirror.local).rows}
    # a live run whose writer stopped beating reads crashed, with no new listing needed
    assert rows["r1"]["status"] == "live" and rows["stale"]["status"] == "crashed", rows
    _meta(url, "r1", status="finished", heartbeat=now + 1, started_at=now - 60, last_step=5, ended_at=now + 1)
    open_store(url).put("r2/run.json", json.dumps({"name": "r2", "created_at": now}).encode())
    _meta(url, "r2", status="finished", heartbeat=now, started_at=now, last_step=0)
    assert page.list_page(mirror.local).matching == 2  # not listed again yet: the list is what was listed
    mirror.sync_once()
    listing = page.list_page(mirror.local)
    rows = {r["id"]: r for r in listing.rows}
    assert listing.matching == 3 and rows["r2"]["status"] == "finished" and rows["r2"]["steps"] == 1
    assert rows["r1"]["status"] == "finished" and rows["r1"]["steps"] == 6
    assert page.list_page(mirror.local, status="live").matching == 0
    assert list(mirror.local.iterdir()) == []


def test_metrics_and_alerts_on_a_bucket_open_only_the_live_runs(s3: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest

    from gpudash.alerts.watch import ServeAlerts
    from gpudash.options import AlertOptions
    from gpudash.server.metrics import metrics_registry

    _bucket("runs")
    record_run("s3://runs/team/a", 4)
    for run in ("b", "live"):
        copy_run("s3://runs/team/a", f"s3://runs/team/{run}")
    _made_live("s3://runs/team/live")
    mirror = RunsMirror("s3://runs/team", tmp_path / "local")
    gets = _gets(mirror.store.fs, monkeypatch)
    mirror.sync_once()
    text = generate_latest(metrics_registry(mirror.local)).decode()
    read = {g.split("/team/")[1].split("/")[0] for g in gets if g.endswith(".parquet")}
    assert read == {"live"}, read  # the finished runs' segments are never read for /metrics
    assert [p.name for p in mirror.local.iterdir() if not p.name.startswith(".")] == ["live"]
    for run in ("a", "b"):  # what their listing says: not live, their heartbeat, their steps
        assert f'gpudash_run_live{{node="{socket.gethostname()}",rank="0",run="{run}"}} 0.0' in text, text
        assert f'gpudash_steps{{run="{run}"}} 4.0' in text
    assert 'gpudash_run_live{' in text and 'run="live"} 1.0' in text
    assert 'gpudash_step{' in text and 'run="live"' in text  # opened: its newest rows

    monkeypatch.setattr(mirror_mod, "OPEN_RUNS", 1)
    alerts = ServeAlerts(mirror.local, AlertOptions(webhook="http://127.0.0.1:9/hook", desktop=False, terminal=False, poll_s=60.0), "http://x")
    try:
        assert [run_id for run_id, _path in alerts._candidates()] == ["live"]
    finally:
        alerts.stop()


def test_a_first_listing_of_many_runs_names_them_all_at_once_and_reads_the_newest_first(
        s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _bucket("runs")
    url = "s3://runs/many"
    for i in range(4):
        open_store(url).put(f"r{i}/run.json", json.dumps({"name": f"r{i}", "created_at": 1000.0 + i}).encode())
        _meta(url, f"r{i}", status="finished", heartbeat=1000.0 + i, started_at=1000.0 + i, last_step=i)
        time.sleep(1.05)  # S3 times are whole seconds: r3 is the newest
    monkeypatch.setattr(runsync, "LIST_BATCH", 4)
    mirror = RunsMirror(url, tmp_path / "local")
    seen: list[dict[str, str]] = []
    real = mirror._fetch

    def fetch(todo: list[tuple[str, str, int, int]]) -> list[bytes | BaseException]:
        seen.append({r["id"]: r["status"] for r in page.list_page(mirror.local).rows})
        return real(todo)

    monkeypatch.setattr(mirror, "_fetch", fetch)
    mirror.sync_once()
    # before the first batch: all four named, none read; after it: the two newest whole, the rest said pending
    assert seen[0] == {f"r{i}": "listing" for i in range(4)}, seen
    # (each batch reads its meta.json objects, then the run.json of the runs none carries a copy for)
    assert {"r3": "finished", "r2": "finished", "r1": "listing", "r0": "listing"} in seen, seen
    rows = page.list_page(mirror.local).rows
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(3, -1, -1)]
    assert {r["status"] for r in rows} == {"finished"} and all(not r["problems"] for r in rows)
    for i in range(4):  # each publishes again (a live run does every few seconds): never said pending again
        _meta(url, f"r{i}", status="finished", heartbeat=2000.0 + i, started_at=1000.0 + i, last_step=i + 1)
    seen.clear()
    monkeypatch.setattr(runsync, "LIST_BATCH", 1)
    assert mirror.sync_once() == 4
    assert len(seen) == 3 and all(set(s.values()) == {"finished"} for s in seen), seen


def test_one_read_per_run_its_run_json_copy_checked_redacted_and_bounded(s3: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's meta.json carries its run's run.json (the publisher's copy of what it put): listed from it alone.
    A run.json changed since (another size) is read itself, as is one whose copy is damaged or over the bound;
    what the copy says goes through the same checks and redaction as run.json read itself."""
    from gpudash.store.listing import LISTING_KEY, RUN_JSON_COPY_BYTES, RUN_JSON_COPY_KEY

    _bucket("runs")
    url = "s3://runs/copies"
    secret = "hf_" + "a" * 34

    def put(run: str, run_json: bytes, copy: dict[str, object] | None) -> None:
        open_store(url).put(f"{run}/run.json", run_json)
        time.sleep(0.01)
        listing = {"last_step": 4} if copy is None else {"last_step": 4, RUN_JSON_COPY_KEY: copy}
        _meta(url, run, status="finished", started_at=1000.0, last_step=4, **{LISTING_KEY: listing})

    body = json.dumps({"name": "same", "created_at": 1000.0, "argv": ["train.py", "--hf-token", secret]}).encode()
    put("same", body, {"size": len(body), "text": body.decode()})
    put("old", json.dumps({"name": "old"}).encode(), None)  # published before the copy existed
    put("lying", b'{"name": "lying"}', {"size": 3, "text": '{"name": "other"}'})  # a damaged copy
    big = json.dumps({"name": "big", "note": "x" * RUN_JSON_COPY_BYTES}).encode()
    put("big", big, {"size": len(big), "text": big.decode()})  # over the bound: not trusted
    mirror = RunsMirror(url, tmp_path / "local")
    gets = _gets(mirror.store.fs, monkeypatch)
    assert mirror.sync_once() == 4 + 3
    assert sorted(g.split("/copies/")[1] for g in gets if g.endswith("run.json")) == [
        "big/run.json", "lying/run.json", "old/run.json"]
    rows = {r["id"]: page.listed_summary(r["id"], mirror.local / r["id"]) for r in page.list_page(mirror.local).rows}
    assert {k: r["name"] for k, r in rows.items()} == {"same": "same", "old": "old", "lying": "lying", "big": "big"}
    assert secret not in json.dumps(rows["same"]["meta"]) and "--hf-token" in rows["same"]["meta"]["argv"]
    assert rows["same"]["steps"] == 5 and rows["same"]["status"] == "finished"

    # renamed in the bucket later (another size): its copy no longer stands in for it
    gets.clear()
    open_store(url).put("same/run.json", json.dumps({"name": "renamed", "created_at": 1000.0}).encode())
    assert mirror.sync_once() == 1 and [g for g in gets if g.endswith("same/run.json")]
    assert page.listed_summary("same", mirror.local / "same")["name"] == "renamed"
