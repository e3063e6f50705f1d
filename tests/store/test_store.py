"""The run store: writer, columnar chunks, roll-ups, tailing, damage, drops."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers.stuck import stuck_writer

from gpudash.errors import RunError
from gpudash.store import RunReader, chunks, load_run
from gpudash.store.writer import Recorder


def _write_steps(rec: Recorder, start: int, n: int, t0: float, dt: float = 0.01) -> None:
    for i in range(start, start + n):
        rec.put("steps", {"step": i, "time": t0 + i * dt, "duration_s": dt, "loss": 1.0 / (i + 1)})


def test_round_trip_with_dynamic_columns(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=0.05)
    rec.put("steps", {"step": 0, "time": 1.0, "duration_s": 0.1, "loss": 2.0})
    rec.put("steps", {"step": 1, "time": 2.0, "duration_s": 0.1, "loss": 1.5, "grad/norm": 3.0, "note": "x"})
    rec.put("events", {"time": 2.0, "step": 1, "kind": "k", "message": "<b>m</b>", "data": {"a": 1}})
    rec.close()
    run = load_run(tmp_path)
    assert run.status == "finished"
    assert list(run.steps["step"]) == [0, 1]
    assert run.steps["grad_norm"].isna().tolist() == [True, False]  # 'grad/norm' -> safe column
    assert pd.isna(run.steps["note"].iloc[0]) and run.steps["note"].iloc[1] == "x"
    assert run.events["message"].tolist() == ["<b>m</b>"]
    assert run.events["data"].tolist() == [{"a": 1}]
    # plain SQLite, readable without gpudash
    with sqlite3.connect(tmp_path / "rank0.db") as c:
        assert c.execute("select count(*) from steps").fetchone()[0] == 2


def test_chunks_equal_plain_sql(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 50)  # read when the writer is made
    rec = Recorder(tmp_path, flush_interval=60)
    t0 = time.time()
    n_flushes = 20
    for f in range(n_flushes):
        _write_steps(rec, f * 7, 7, t0)
        if f == 10:
            rec.put("steps", {"step": -1, "time": t0, "duration_s": 0.0, "late_col": 5.0})
        assert rec.flush()
    with sqlite3.connect(tmp_path / "rank0.db") as c:  # while it runs: whole chunks only, the rest rows
        live = c.execute("select first_rowid, last_rowid from colchunks where tbl = 'steps' order by 1").fetchall()
    assert live and all(b - a + 1 >= 50 for a, b in live) and live[0][0] == 1
    rec.close()
    fast = load_run(tmp_path).steps.drop(columns="rank")
    with sqlite3.connect(tmp_path / "rank0.db") as c:
        plain = pd.read_sql_query("select * from steps order by rowid", c)
        spans = c.execute("select first_rowid, last_rowid from colchunks where tbl = 'steps' order by 1").fetchall()
    assert spans[-1][1] == len(plain)  # at close the rest became a chunk: contiguous from the first row
    assert all(a == b + 1 for (a, _), (_, b) in zip(spans[1:], spans[:-1], strict=True))
    assert len(fast) == len(plain) == n_flushes * 7 + 1
    pd.testing.assert_frame_equal(fast[plain.columns].astype(float), plain.astype(float))


def test_a_resumed_writer_chunks_the_rows_a_killed_one_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_ROWS", 40)
    killed = (f"import os, sys; sys.path.insert(0, {str(Path(__file__).parents[2])!r})\n"
              "from gpudash.store import chunks; chunks.CHUNK_ROWS = 40\n"
              "from gpudash.store.writer import Recorder\n"
              f"rec = Recorder({str(tmp_path)!r}, flush_interval=60)\n"
              "for i in range(120):\n"
              "    rec.put('steps', {'step': i, 'time': 1000.0 + i, 'duration_s': 0.01})\n"
              "    if i % 25 == 24 or i == 119: assert rec.flush()\n"
              "os.kill(os.getpid(), 9)\n")  # chunks of rows 1-50 and 51-100 written, 20 rows left unchunked
    subprocess.run([sys.executable, "-c", killed], timeout=120)
    with sqlite3.connect(tmp_path / "rank0.db") as c:
        assert c.execute("select max(last_rowid) from colchunks where tbl = 'steps'").fetchone()[0] == 100
    rec = Recorder(tmp_path, flush_interval=60)  # the same rank again
    _write_steps(rec, 120, 30, 1000.0)
    rec.close()
    with sqlite3.connect(tmp_path / "rank0.db") as c:
        spans = c.execute("select first_rowid, last_rowid from colchunks where tbl = 'steps' order by 1").fetchall()
    assert spans == [(1, 50), (51, 100), (101, 150)]  # the killed writer's 20 rows in the new writer's chunk
    assert load_run(tmp_path).steps["step"].tolist() == list(range(150))


def test_rollups_keep_mean_min_max(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=60)
    t0 = 60.0 * 16_667  # a bucket boundary for both levels
    vals = np.arange(300, dtype=float)
    for i, v in enumerate(vals):
        rec.put("host", {"step": i, "time": t0 + i * 0.5, "rss_bytes": v})
        rec.put("memory", {"step": i, "time": t0 + i * 0.5, "allocated_bytes": v})
        if i % 37 == 0:
            rec.flush()
    rec.close()
    reader = RunReader(tmp_path)
    r1 = reader.ranks[0].read_rollup("host", 1, None, None)
    assert len(r1) == 150
    assert r1["rss_bytes"].iloc[0] == 0.5 and r1["rss_bytes__max"].iloc[0] == 1
    r60 = reader.ranks[0].read_rollup("host", 60, None, None)
    assert r60["n"].tolist() == [120, 120, 60]
    assert r60["rss_bytes__min"].tolist() == [0, 120, 240]
    assert r60["rss_bytes__max"].tolist() == [119, 239, 299]
    assert r60["step__max"].tolist() == [119, 239, 299]
    df, level = reader.read_range("host", max_rows=100)
    assert level == 60 and len(df) == 3
    df, level = reader.read_range("host", t0, t0 + 10, max_rows=100)
    assert level == 0 and len(df) == 21
    assert reader.ranks[0].read_rollup("memory", 1, None, None).empty  # a step table: drawn from its rows
    df, level = reader.read_range("memory", max_rows=100)
    assert level == 0 and len(df) == 300


def test_read_range_by_steps(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=60)
    _write_steps(rec, 0, 100, 1000.0, dt=0.5)
    rec.close()
    reader = RunReader(tmp_path)
    df, level = reader.read_range("steps", step0=10, step1=19)
    assert level == 0 and df["step"].tolist() == list(range(10, 20))


def test_read_since_tails_a_growing_run(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=0.02)
    reader = RunReader(tmp_path)
    cursor = None
    seen: list[int] = []
    t0 = time.time()
    for batch in range(5):
        _write_steps(rec, batch * 10, 10, t0)
        rec.flush()
        new, cursor = reader.read_since(cursor)
        seen += new["steps"]["step"].tolist()
    rec.close()
    new, cursor = reader.read_since(cursor)
    assert "steps" not in new
    assert seen == list(range(50))
    assert reader.status() == "finished"


def test_full_buffer_drops_oldest_and_counts(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=60, capacity=100)
    with stuck_writer(rec):
        _write_steps(rec, 0, 1000, 0.0)
        # steps are let go a block at a time as blocks open (the memory held stays within capacity + a block);
        # the count is exact once the writer reads
        block = rec.steps.block_rows
        assert 900 - block <= rec.dropped <= 900 and rec.queued <= 100 + block
    rec.close()
    assert rec.dropped == 900
    run = load_run(tmp_path)
    assert run.steps["step"].tolist() == list(range(900, 1000))
    assert run.meta["dropped_records"] == 900


def test_heartbeat_stops_means_crashed(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=0.05)
    rec.flush()
    reader = RunReader(tmp_path)
    assert reader.status() == "live"
    meta = reader.ranks[0].meta()
    assert reader.ranks[0].status(meta, now=meta["heartbeat"] + 60) == "crashed"
    rec.close()
    assert reader.status() == "finished"


def test_between_stored_heartbeats_the_log_mtime_is_the_heartbeat(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=0.05)
    assert rec.flush()  # stores the heartbeat key; the next store is ROLLUP_INTERVAL_S away
    with sqlite3.connect(f"file:{tmp_path / 'rank0.db'}?mode=ro", uri=True) as c:
        stored = float(c.execute("select value from meta where key = 'heartbeat'").fetchone()[0])
    time.sleep(0.6)  # idle flushes write no page, they touch the log
    reader = RunReader(tmp_path)
    meta = reader.ranks[0].meta()
    assert meta["heartbeat"] > stored + 0.4 and reader.status() == "live"
    rec.close()
    assert reader.status() == "finished"


def test_bad_paths_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no such run directory"):
        load_run(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(RunError, match="not a directory"):
        load_run(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="not a gpudash run"):
        load_run(tmp_path / "empty")
