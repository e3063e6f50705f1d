"""One bad run never takes the others down (issue 26): every query has a deadline, views and FIFOs are
never read, and a run that hangs (its reader held) holds up neither the runs list, the API nor /metrics."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from helpers.hostile_cases import ENDLESS, events_recursive_view, healthy
from prometheus_client import generate_latest

from gpudash.server import runcache, scrape
from gpudash.server.layouts import runs as runs_page
from gpudash.server.metrics import metrics_registry
from gpudash.server.runcache import shared_cache
from gpudash.store import bounded
from gpudash.store.bounded import UnsafeFile, connect, read_regular
from gpudash.store.reader import RunReader


def test_every_query_has_a_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "QUERY_S", 0.3)
    conn = connect(":memory:")
    t0 = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="interrupt") as err:
        conn.execute(f"SELECT count(*) FROM ({ENDLESS})").fetchall()
    assert time.monotonic() - t0 < 10
    assert bounded.damage(err.value) == "a query ran over 0.3 s and was stopped"
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the next query has its own deadline


def test_connection_runs_no_schema_code_and_writes_nothing(tmp_path: Path) -> None:
    run = healthy(tmp_path / "r")
    conn = connect(run / "rank0.db")
    assert conn.execute("PRAGMA trusted_schema").fetchone() == (0,)
    assert conn.execute("PRAGMA query_only").fetchone() == (1,)
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("CREATE TABLE x (a)")
    with pytest.raises(sqlite3.OperationalError):  # no ATTACH of another file through a crafted name
        conn.execute("ATTACH DATABASE ':memory:' AS other")


def test_a_view_is_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "QUERY_S", 60.0)  # a view that ran would hang this test, not be stopped
    run = healthy(tmp_path / "r")
    events_recursive_view(run)
    reader = RunReader(run)
    try:
        rr = reader.ranks[0]
        assert rr.columns("events") == [] and rr.max_rowid("events") == 0
        assert rr.query("SELECT count(*) FROM events", tables=("events",)) is None
        assert reader.read_table("events").empty
        assert [p for p in reader.all_problems() if "events is a view" in p]
    finally:
        reader.close()


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeFile, match="FIFO"):
        read_regular(tmp_path / "fifo", 100)  # returns at once: never opened
    with pytest.raises(UnsafeFile, match="a folder"):
        read_regular(tmp_path, 100)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(UnsafeFile, match="over the 100 bytes"):
        read_regular(tmp_path / "big", 100)
    assert read_regular(tmp_path / "big", 101) == b"x" * 101


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    healthy(runs / "good")
    healthy(runs / "stuck")
    shared_cache().clear()
    runs_page._CACHE.clear()
    runs_page._ENTRIES.clear()
    return runs


def _hold(lock: threading.Lock, release: threading.Event) -> threading.Thread:
    """A request stuck reading a run: holds its lock until ``release``."""
    got = threading.Event()

    def hold() -> None:
        with lock:
            got.set()
            release.wait(60)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert got.wait(10)
    return t


def test_metrics_serves_the_others_while_a_run_hangs(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrape, "RUN_BUDGET_S", 0.5)
    registry = metrics_registry(two_runs, facts=False)
    _, lock = shared_cache().reader(two_runs / "stuck")
    release = threading.Event()
    holder = _hold(lock, release)
    try:
        texts: list[str] = []
        scrapes = [threading.Thread(target=lambda: texts.append(generate_latest(registry).decode()))
                   for _ in range(2)]  # two scrapes at once: no lock across a scrape
        for t in scrapes:
            t.start()
        for t in scrapes:
            t.join(30)
        assert len(texts) == 2
        for text in texts:
            assert 'gpudash_step{node=' in text and 'run="good"' in text
            assert 'gpudash_run_damaged{problem="still being read after 0.5 s; skipped",run="stuck"}' in text
    finally:
        release.set()
        holder.join(10)


def test_runs_list_serves_the_others_while_a_run_hangs(two_runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs_page, "WAIT_S", 0.5)
    cache = shared_cache()
    with cache._lock:
        load_lock = cache._locks.setdefault((two_runs / "stuck").resolve(), threading.Lock())
    release = threading.Event()
    holder = _hold(load_lock, release)
    try:
        listing = runs_page.list_page(two_runs, status="all")
        rows = {r["id"]: r for r in listing.rows}
        assert rows["good"]["status"] == "finished" and rows["good"]["steps"] == 30
        assert rows["stuck"]["status"] == "unreadable" and "still being read" in rows["stuck"]["problems"][0]
    finally:
        release.set()
        holder.join(10)
    # the busy answer was not kept: asked again, the run is summarised
    again = {r["id"]: r for r in runs_page.list_page(two_runs).rows}
    assert again["stuck"]["status"] == "finished"


def test_runcache_opens_a_reader_outside_its_own_lock(two_runs: Path) -> None:
    """A run slow to open does not stop another run's reader from opening."""
    cache = runcache.RunCache()
    with cache._lock:
        slow = cache._open_locks.setdefault((two_runs / "stuck").resolve(), threading.Lock())
    release = threading.Event()
    holder = _hold(slow, release)
    try:
        reader, _ = cache.reader(two_runs / "good")
        assert 0 in reader.ranks
    finally:
        release.set()
        holder.join(10)
        cache.clear()
