"""A folder of runs in an object store (issue 45): listed from each run's metadata alone (no segment read or
copied), a run's segments fetched when it is opened, into a bounded cache shared by its readers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="object-store tests need s3fs (pip install 'gpudash[s3]')")
pytest.importorskip("moto.server", reason="object-store tests need moto[server] (dev extra)")

from helpers.s3 import bucket as _bucket

from gpudash import load_run
from gpudash.monitor import Monitor
from gpudash.server.layouts import runs as page
from gpudash.server.runcache import shared_cache
from gpudash.store import mirror as mirror_mod
from gpudash.store import runsync
from gpudash.store.objstore import open_store
from gpudash.store.runsync import RunsMirror, origin_of


def _recorded(url: str, steps: int) -> None:
    with Monitor(url, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        for i in range(steps):
            with mon.step(samples=4):
                mon.log(loss=1.0 / (i + 1))


def _copy_run(src: str, dest: str) -> None:
    store = open_store(src)
    for name in store.find(""):
        open_store(dest).put(name, store.get(name))


def _gets(store_fs: object, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every object read whole through the store's filesystem (one instance per set of options in fsspec:
    the listing's and each opened run's store share it)."""
    seen: list[str] = []
    real = store_fs.cat_file  # type: ignore[attr-defined]

    def cat_file(path: str, *a: object, **k: object) -> object:
        seen.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(store_fs, "cat_file", cat_file)
    return seen


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    page._CACHE.clear()
    page._ENTRIES.clear()
    shared_cache().clear()
    runsync.close_mirrors()
    yield
    shared_cache().clear()
    runsync.close_mirrors()


def test_a_bucket_is_listed_from_metadata_and_a_run_opened_on_demand(s3: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _bucket("runs")
    _recorded("s3://runs/team/a", 7)
    _copy_run("s3://runs/team/a", "s3://runs/team/b")
    mirror = RunsMirror("s3://runs/team", tmp_path / "local")
    gets = _gets(mirror.store.fs, monkeypatch)
    assert mirror.sync_once() == 4  # run.json and meta.json of each run: nothing else
    assert len(gets) == 4 and not [g for g in gets if g.endswith(".parquet")], gets
    local = {p.relative_to(mirror.local).as_posix() for p in mirror.local.rglob("*") if p.is_file()}
    assert local == {"a/run.json", "a/segments/rank=0/meta.json", "b/run.json", "b/segments/rank=0/meta.json"}
    assert origin_of(mirror.local / "a") == "s3://runs/team/a" and origin_of(tmp_path) is None

    listing = page.list_page(mirror.local)
    assert listing.matching == 2 and {r["id"] for r in listing.rows} == {"a", "b"}
    row = next(r for r in listing.rows if r["id"] == "a")
    assert not [g for g in gets if g.endswith(".parquet")], gets  # listed: still no segment read
    assert row["status"] == "finished" and row["steps"] == 7 and row["ranks"] == 1 and row["problems"] == []
    assert page.list_page(mirror.local, status="finished").matching == 2  # the filter reads the same metadata
    assert page.list_page(mirror.local, query="b").matching == 1
    assert mirror.sync_once() == 0  # nothing changed: nothing fetched again

    # opened: its segments are fetched now, and the loaded run's facts say what its row said
    opened = page.run_summary("a", mirror.local / "a")
    assert [g for g in gets if "/team/a/segments/" in g and g.endswith(".parquet")]
    assert not [g for g in gets if "/team/b/segments/" in g and g.endswith(".parquet")]
    for key in ("status", "steps", "ranks", "peak_bytes", "name", "started"):
        assert opened[key] == row[key], key
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
    _recorded("s3://runs/team/a", 3)
    _copy_run("s3://runs/team/a", "s3://runs/team/b")
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
