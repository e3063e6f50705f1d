"""A loop that holds the GIL: the writer stores its rows in statements of many rows (few GIL hand-overs a
flush), and the loop lends it the GIL when records come faster than it gets the GIL to store them, so the
queue stays near ``LEND_ROWS`` and nothing is dropped; slow records, or a writer that does not run in the time
lent, get no more lends."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

import gpudash.store.tables as tables
from gpudash.store.chunks import read_chunks
from gpudash.store.lending import LEND_ROWS
from gpudash.store.writer import Recorder


def _row(i: int) -> dict[str, float]:
    return {"step": i, "time": float(i), "duration_s": 0.001, "loss": 1.0 / (i + 1), "lr": 3e-4, "gn": float(i % 7)}


@pytest.mark.parametrize("small", [0, 60])
def test_rows_across_many_statements_keep_their_order_and_rowids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  small: int) -> None:
    """Statements of 7 rows (one shorter at the end of each batch), batches of up to ``small`` rows with
    ``executemany``: every row once, in order, and the chunks (which number rows by the first rowid of each
    batch) hold the same numbers as the table."""
    monkeypatch.setattr(tables, "ROWS_PER_STATEMENT", 7)
    monkeypatch.setattr(tables, "EXECUTEMANY_ROWS", small)
    rec = Recorder(tmp_path, flush_interval=3600)
    try:
        for part in (range(0, 50), range(50, 51), range(51, 130)):
            for i in part:
                rec.put("steps", _row(i))
            assert rec.flush()
    finally:
        rec.close()
    with sqlite3.connect(tmp_path / "rank0.db") as conn:
        got = conn.execute("SELECT rowid, step, loss FROM steps ORDER BY rowid").fetchall()
        cols, arr, covered = read_chunks(conn, "steps")
    assert [s for _, s, _ in got] == list(range(130)) and [r for r, _, _ in got] == list(range(1, 131))
    assert [loss for _, _, loss in got] == [1.0 / (i + 1) for i in range(130)]
    assert arr is not None and covered == 130  # no gap: each batch's first rowid was the one SQLite gave
    assert np.array_equal(arr[cols.index("step")], np.arange(130.0))


def test_a_loop_that_holds_the_gil_loses_no_record_and_keeps_a_short_queue(tmp_path: Path) -> None:
    """120,000 records from a pure-Python loop with room for 40,000: before lending the writer stored ~7,000
    a second while such a loop queued far more, so the queue filled and the oldest records were dropped."""
    rec = Recorder(tmp_path, capacity=40_000)
    longest = 0
    try:
        for i in range(120_000):
            rec.put("steps", _row(i))
            if not i % 256:
                longest = max(longest, rec.queued)
    finally:
        rec.close()
    with sqlite3.connect(tmp_path / "rank0.db") as conn:
        stored = conn.execute("SELECT count(*), min(step), max(step) FROM steps").fetchone()
    assert rec.dropped == 0 and tuple(stored) == (120_000, 0, 119_999)
    assert longest < 40_000, longest


def test_no_lend_to_a_writer_that_does_not_run_or_for_records_that_come_slowly(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=3600)
    try:
        lender = rec.lender
        lender._drained_at = time.monotonic()  # records came fast; the writer sleeps (nothing woke it): it cannot run
        lender.lend(5000)
        assert lender.at == 5000 + LEND_ROWS  # no lend again before another LEND_ROWS records
        lender.at = LEND_ROWS
        lender._drained_at = time.monotonic() - 60.0  # 3,000 records in a minute: slow, the GIL is not the problem
        t0 = time.perf_counter()
        lender.lend(3000)
        assert time.perf_counter() - t0 < 0.05 and lender.at == 3000 + LEND_ROWS
    finally:
        rec.close()


def test_a_writer_that_fails_for_now_gets_no_lend(tmp_path: Path) -> None:
    """While writes fail for now (a full disk), records wait in memory for the next retry: nothing is lent."""
    rec = Recorder(tmp_path, flush_interval=3600, flush_rows=4)
    try:
        rec._failing = (time.time(), "disk full")
        rec._woken = True
        rec.lender.at = 4
        slept: list[int] = []
        rec.lender.lend = slept.append  # type: ignore[method-assign]
        for i in range(20):
            rec.put("steps", _row(i))
        assert slept == []
    finally:
        rec._failing = None
        rec.close()


def test_records_put_after_close_are_never_lent_for(tmp_path: Path) -> None:
    """A loop that goes on after its Monitor closed (a signal handler closed it): the writer's thread has ended,
    its CPU clock with it; queuing records raises nothing and waits for nothing."""
    rec = Recorder(tmp_path)
    rec.close()
    t0 = time.perf_counter()
    for i in range(5000):
        rec.put("steps", _row(i))
    assert time.perf_counter() - t0 < 2.0
    rec._stop.clear()  # as if the stop were not seen yet: the ended thread's clock must not raise either
    rec._woken, rec.lender.at, rec.lender._drained_at = True, 1, time.monotonic()
    rec.put("steps", _row(5000))
    rec._stop.set()
