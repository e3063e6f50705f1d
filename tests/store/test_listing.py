"""What a rank's meta.json carries for the runs list (issue 45): folded from the new rows only, and read back
into the row the list shows, in the loaded run's order of peak columns."""

from __future__ import annotations

import sqlite3
import time

from gpudash.analysis.listing import listed_row, run_status
from gpudash.store.listing import LISTING_KEY, PARTS_KEY, ListingTally


def _db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE steps (step INTEGER, time REAL, duration_s REAL)")
    conn.execute("CREATE TABLE memory (time REAL, reserved_bytes REAL, peak_bytes REAL, note TEXT)")
    return conn


def test_the_tally_folds_only_new_rows_and_keeps_the_maxima() -> None:
    conn = _db()
    tally = ListingTally()
    assert tally.update(conn) == {"last_step": None, "first_time": None, "last_time": None, "max": {},
                                  PARTS_KEY: None}
    conn.executemany("INSERT INTO steps VALUES (?, ?, ?)", [(0, 100.5, 0.5), (1, 101.0, 0.5)])
    conn.executemany("INSERT INTO memory VALUES (?, ?, ?, ?)", [(100.0, 5e9, 6e9, "x"), (101.0, 4e9, None, "y")])
    out = tally.update(conn)
    assert out == {"last_step": 1, "first_time": 100.0, "last_time": 101.0,
                   "max": {"reserved_bytes": 5e9, "peak_bytes": 6e9}, PARTS_KEY: None}
    conn.execute("UPDATE steps SET step = 99")  # rows already folded are never read again: only rowids after the last
    conn.executemany("INSERT INTO steps VALUES (?, ?, ?)", [(2, 102.0, 1.0)])
    conn.executemany("INSERT INTO memory VALUES (?, ?, ?, ?)", [(102.0, 7e9, 1e9, "z")])
    out = tally.update(conn)
    assert out["last_step"] == 2 and out["first_time"] == 100.0 and out["last_time"] == 102.0
    assert out["max"] == {"reserved_bytes": 7e9, "peak_bytes": 6e9}


def test_a_run_that_measured_no_peak_lists_the_largest_sum_of_its_parts() -> None:
    """A CPU run has no peak, reserved or allocated bytes: its peak is the largest per-row sum of its memory
    categories (facts.peak_memory), a part missing or not a number counting 0 in its row."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE memory (time REAL, params_bytes REAL, grads_bytes REAL, other_bytes TEXT, "
                 "free_bytes REAL)")
    conn.executemany("INSERT INTO memory VALUES (?, ?, ?, ?, ?)",
                     [(1.0, 100, 50, "n/a", 1e12), (2.0, 120, None, None, 1e12), (3.0, None, None, None, 1e12)])
    out = ListingTally().update(conn)
    assert out[PARTS_KEY] == 150.0 and out["max"]["free_bytes"] == 1e12
    row = listed_row("cpu", {}, {0: {"status": "finished", LISTING_KEY: out}}, [])
    assert row["peak_bytes"] == 150.0  # not the free bytes: no category


def test_a_listed_row_counts_like_the_loaded_run() -> None:
    now = time.time()
    ranks = {
        0: {"status": "finished", "started_at": 1000.0, "ended_at": 1100.0, "first_step": 1, "device": "cpu",
            LISTING_KEY: {"last_step": 50, "first_time": 1001.0, "last_time": 1090.0,
                          "max": {"reserved_bytes": 9e9, "peak_bytes": 3e9}}},
        1: {"status": "finished", "started_at": 1002.0,
            LISTING_KEY: {"last_step": 50, "first_time": 1003.0, "last_time": 1095.0,
                          "max": {"reserved_bytes": 8e9, "peak_bytes": 4e9}}},
    }
    row = listed_row("r", {"name": "nice"}, ranks, [])
    # steps numbered from 1; the measured peak before reserved; from the run's start to its end
    assert row["steps"] == 50 and row["peak_bytes"] == 4e9 and row["duration_s"] == 100.0
    assert row["status"] == "finished" and row["ranks"] == 2 and row["name"] == "nice" and row["started"] == 1000.0
    live = {0: {"status": "live", "heartbeat": now, "publish_interval": 3.0}}
    stale = {0: {"status": "live", "heartbeat": now - 600, "publish_interval": 3.0}}
    assert run_status(live) == "live" and run_status(stale) == "crashed" and run_status({}) == "crashed"
    died = listed_row("d", {}, stale, [])
    assert died["status"] == "crashed" and died["end_reason"] and [p for p in died["problems"] if "rank 0" in p]
    assert listed_row("x", {}, {0: {"status": "live", "heartbeat": "soon"}}, [])["status"] == "crashed"


def test_an_object_read_at_its_listed_size_is_still_bounded() -> None:
    import uuid

    import pytest

    from gpudash.store.bounded import UnsafeFile
    from gpudash.store.objstore import open_store

    store = open_store(f"memory://b{uuid.uuid4().hex[:8]}/runs")
    store.put("r/run.json", b'{"name": "r"}')
    assert store.get("r/run.json", limit=100, size=13) == b'{"name": "r"}'
    store.put("r/run.json", b"x" * 50)  # replaced by a larger object after the listing said 13 bytes
    with pytest.raises(UnsafeFile, match="over the 20 bytes read at most"):
        store.get("r/run.json", limit=20, size=13)


def test_a_files_views_are_never_run_to_tally_it() -> None:
    """A local run's rank file is tallied only from its real tables: a view named like one is someone else's code."""
    conn = _db()
    conn.execute("INSERT INTO steps VALUES (3, 10.0, 1.0)")
    conn.execute("DROP TABLE memory")
    conn.execute("CREATE VIEW memory AS SELECT 1e15 AS reserved_bytes")
    out = ListingTally().update(conn, {"steps"})
    assert out["last_step"] == 3 and out["max"] == {} and out[PARTS_KEY] is None
