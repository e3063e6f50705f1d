"""The writer's memory reaches its steady size early: a full queue wakes it before its interval, each numeric
table's rows wait for their chunk in a block allocated up front; nothing is lost or changed by either."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from gpudash.store.chunks import ChunkWriter, read_chunks
from gpudash.store.writer import Recorder


def _wait_for(cond: object, what: str, limit: float = 60.0) -> None:
    """Poll ``cond`` (a callable) until it holds; the limit only stops a broken writer from hanging the test."""
    deadline = time.monotonic() + limit
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.01)


@pytest.mark.parametrize("table", ["steps", "memory"])
def test_a_queue_past_its_row_threshold_wakes_the_writer(tmp_path: Path, table: str) -> None:
    """Records wake the writer at ``flush_rows``: step rows (packed) when a block of the step log is full."""
    rec = Recorder(tmp_path, flush_interval=3600, flush_rows=16)  # its timer would not fire within the test
    mark = rec.steps.block_rows if table == "steps" else rec.flush_rows
    assert mark == 16
    try:
        for i in range(mark - 1):
            rec.put(table, {"step": i, "time": float(i), "duration_s": 0.1})
        assert not rec._wake.is_set() and rec.queued == mark - 1  # below the threshold: left for the timer
        for i in range(mark - 1, 2 * mark + 8):
            rec.put(table, {"step": i, "time": float(i), "duration_s": 0.1})
        _wait_for(lambda: not rec.queued, "the writer was not woken by a queue past its threshold")
        with sqlite3.connect(tmp_path / "rank0.db") as conn:
            _wait_for(lambda: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] >= mark,
                      "the woken writer committed nothing")
    finally:
        rec.close()
    with sqlite3.connect(tmp_path / "rank0.db") as conn:
        steps = [s for (s,) in conn.execute(f"SELECT step FROM {table} ORDER BY rowid")]
    assert steps == list(range(2 * mark + 8)) and rec.dropped == 0  # every record, in order, once


def test_flush_rows_is_at_most_the_capacity_and_at_least_one(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "a", capacity=10, flush_rows=1000)
    assert rec.flush_rows == 10
    rec.close()
    with pytest.raises(ValueError, match="flush_rows"):
        Recorder(tmp_path / "b", flush_rows=0)


def _chunked(conn: sqlite3.Connection, table: str) -> tuple[list[str], np.ndarray]:
    cols, arr, _ = read_chunks(conn, table)
    assert arr is not None
    return cols, arr.T  # read as (columns, rows)


def test_chunks_from_the_block_hold_the_rows_as_parts_did(tmp_path: Path) -> None:
    """Rows in pieces of any size, a column that appears midway, a rolled-back transaction: the chunks
    hold exactly the committed rows, whether they waited in the block or as parts."""
    conn = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    conn.execute("CREATE TABLE t (a REAL, b REAL, c REAL)")
    cw = ChunkWriter(conn, rows=16)
    rowid, want = 1, []

    def add(names: list[str], n: int, *, commit: bool = True) -> None:
        nonlocal rowid
        arr = np.arange(rowid, rowid + n, dtype=float)[:, None] * np.arange(1, len(names) + 1, dtype=float)
        cw.begin()
        conn.execute("BEGIN")
        cw.append("t", rowid, names, arr)
        if not commit:
            conn.execute("ROLLBACK")
            cw.rollback()
            return
        conn.execute("COMMIT")
        full = np.full((n, 3), np.nan)
        for j, name in enumerate(names):
            full[:, "abc".index(name)] = arr[:, j]
        want.append(full)
        rowid += n

    for n in (3, 5, 8, 7):  # into the block; the third fills the first chunk exactly
        add(["a", "b"], n)
    add(["a", "b"], 4, commit=False)  # undone: the block's rows stay as they were
    add(["a", "b"], 9, commit=False)  # undone after it wrote a chunk: the block holds its rows again
    add(["a", "b"], 9)  # the chunk written for real, then the next rows into the same block
    add(["a", "b"], 3)
    add(["a", "b"], 20)  # more than a chunk's rows at once: as a part
    add(["a", "b"], 6)
    add(["a", "b", "c"], 5)  # a new column: the block widens
    add(["a", "b", "c"], 9)
    add(["a", "b", "c"], 2)
    add(["a", "b"], 4)  # a column missing from these rows: NaN there
    add(["c", "a"], 3, commit=False)  # undone after a change of columns
    add(["c", "a"], 3)
    add(["a", "b", "c"], 2)
    cw.write_all()
    cols, arr = _chunked(conn, "t")
    expect = np.concatenate(want)
    got = np.full((len(arr), 3), np.nan)
    for j, name in enumerate(cols):
        got[:, "abc".index(name)] = arr[:, j]
    assert got.shape == expect.shape
    assert np.array_equal(got, expect, equal_nan=True)
    starts = [r for (r,) in conn.execute("SELECT first_rowid FROM colchunks ORDER BY first_rowid")]
    assert starts[:3] == [1, 17, 33]  # a chunk every 16 rows (the 20 rows overshoot it, as before)
    conn.close()


def test_a_table_s_blocks_are_taken_before_its_rows_and_reused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    conn.execute("CREATE TABLE t (a REAL, b REAL)")
    cw = ChunkWriter(conn, rows=8)
    blocks: set[int] = set()
    for i in range(12):  # 6 chunks of 8 rows, 4 rows a transaction
        cw.begin()
        cw.append("t", 1 + 4 * i, ["a", "b"], np.full((4, 2), float(i)))
        pend = cw._pending["t"]
        assert not pend.parts
        if pend.rows:
            assert pend.block is not None and pend.block.shape == (8, 2)
            blocks.add(id(pend.block))
    assert len(blocks) == 1  # one block, taken at the first rows, reused for every chunk
    conn.close()


def test_rows_whose_columns_come_and_go_stay_in_one_block(tmp_path: Path) -> None:
    """Issue 41: memory rows gain two columns on the steps that measure activations; those rows and the ones
    around them wait for their chunk in the table's block (widened once), not as pieces that grow the writer's
    memory with every flush until the chunk."""
    conn = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    conn.execute("CREATE TABLE memory (step REAL, held REAL, act REAL)")
    cw = ChunkWriter(conn, rows=64)
    for i in range(30):
        names = ["step", "held", "act"] if i % 7 == 3 else ["step", "held"]
        cw.begin()
        cw.append("memory", 1 + 2 * i, names, np.full((2, len(names)), float(i)))
        pend = cw._pending["memory"]
        assert not pend.parts and pend.block is not None
    cw.write_all()
    cols, arr = _chunked(conn, "memory")
    assert cols == ["step", "held", "act"]
    act = arr[:, 2]  # (rows, columns)
    assert np.array_equal(act[np.isfinite(act)], np.repeat([3.0, 10.0, 17.0, 24.0], 2))
    assert np.array_equal(arr[:, 0], np.repeat(np.arange(30.0), 2))
    conn.close()


def _sqlite_memory_used() -> int | None:
    import _sqlite3
    import ctypes

    try:
        fn = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int64
    return int(fn())


def test_a_written_chunk_is_not_kept_by_sqlite(tmp_path: Path) -> None:
    """Issue 41: a prepared statement SQLite keeps holds the values it last ran with; the chunk insert's were a
    table's 4,096 rows as one blob (~260 KB here) held in the watched process for the rest of the run."""
    if _sqlite_memory_used() is None:
        pytest.skip("this Python's sqlite3 does not export sqlite3_memory_used")
    rec = Recorder(tmp_path, flush_interval=3600)
    try:
        cols = [f"c{j}" for j in range(8)]
        for i in range(4000):
            rec.put("memory", {"step": i, "time": float(i), **{c: float(i * j) for j, c in enumerate(cols)}})
        assert rec.flush()
        before = _sqlite_memory_used()
        for i in range(4000, 4200):  # past the chunk's 4,096 rows: the chunk is written
            rec.put("memory", {"step": i, "time": float(i), **{c: float(i * j) for j, c in enumerate(cols)}})
        assert rec.flush()
        after = _sqlite_memory_used()
        with sqlite3.connect(tmp_path / "rank0.db") as conn:
            blob = conn.execute("SELECT max(length(data)) FROM colchunks WHERE tbl = 'memory'").fetchone()[0]
    finally:
        rec.close()
    assert before is not None and after is not None
    assert blob and blob > 200_000  # the chunk was written ...
    assert after - before < blob // 4, (before, after, blob)  # ... and SQLite let go of it


def test_step_rows_and_other_records_wake_the_writer_together(tmp_path: Path) -> None:
    """A GPU step queues a step row and a memory record: the writer is woken when ``flush_rows`` wait in all, as
    when both went in one queue (woken half as often, the memory records' dicts piled up twice as long: the
    watched process held ~30 KB more between flushes)."""
    rec = Recorder(tmp_path, flush_interval=3600, flush_rows=16)
    try:
        for i in range(8):
            rec.put("steps", {"step": i, "time": float(i), "duration_s": 0.1})
            rec.put("memory", {"step": i, "time": float(i), "allocated_bytes": 1})
        assert not rec._wake.is_set() and rec.queued == 16  # (each queue alone is below its threshold)
        rec.put("memory", {"step": 8, "time": 8.0, "allocated_bytes": 1})
        _wait_for(lambda: not rec.queued, "the writer was not woken by 16 records of two queues")
    finally:
        rec.close()
