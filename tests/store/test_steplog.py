"""The step log (gpudash.store.steplog): rows packed on the recording thread, read back in order, once."""

from __future__ import annotations

import sqlite3
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash.store.steplog import PACKED, StepLog, drop_oldest, mark_unpacked, numbers, record_rows, records
from gpudash.store.tables import TABLE_TAG
from gpudash.store.writer import Recorder


def _rows_of(recs: list[dict[Any, Any]]) -> list[dict[Any, Any]]:
    """The writer's records as rows again (without the table tag)."""
    out = []
    for r in recs:
        p = r.get(PACKED)
        if p is not None:
            out += [dict(zip(p.keys, t, strict=True)) for t in p.rows]
        else:
            out.append({k: v for k, v in r.items() if k is not TABLE_TAG})
    return out


def test_the_unpacked_mark_is_the_writers_table_tag() -> None:
    row: dict[Any, Any] = {"loss": 1.0}
    mark_unpacked(row)
    assert row[TABLE_TAG] == "steps"


def test_steady_rows_are_packed_and_come_back_equal_in_order() -> None:
    log = StepLog(1000, block_rows=8)
    rows = [{"step": i, "time": 1e9 + i, "loss": 1.0 / (i + 1), "ok": True} for i in range(30)]
    for r in rows:
        log.put(dict(r))
    assert all(b.codec is not None for b in log._blocks)  # every row packed
    got = _rows_of(log.take(log.writer, records))
    assert got == [{**r, "ok": 1} for r in rows]
    assert type(got[0]["step"]) is int and type(got[0]["time"]) is float
    assert log.waiting() == 0 and len(log._blocks) == 1  # read blocks let go, the open one kept


def test_dropping_the_oldest_counts_rows_not_records() -> None:
    log = StepLog(1000, block_rows=4)
    for i in range(8):
        log.put({"step": i, "loss": 0.5})
    items = log.take(log.writer, records) + [{TABLE_TAG: "events", "kind": "x"}]  # two packed records, one dict
    assert record_rows(items) == 9
    assert drop_oldest(items, 5) == 8  # a packed record goes whole: the two blocks hold the first 5 rows
    assert items == [{TABLE_TAG: "events", "kind": "x"}]
    assert drop_oldest(items, 0) == 0 and drop_oldest(items, 10) == 1 and items == []


class _Tensorish:
    """What a GPU tensor would do if packing touched it."""

    def __float__(self) -> float:
        raise AssertionError("packed: __float__ called (a GPU sync)")

    def __index__(self) -> int:
        raise AssertionError("packed: __index__ called (a GPU sync)")


def test_rows_that_cannot_be_packed_go_as_they_are_and_keep_their_place() -> None:
    log = StepLog(1000, block_rows=4)
    t = _Tensorish()
    rows: list[dict[Any, Any]] = [
        {"step": 0, "loss": 1.0},
        {"step": 1, "loss": 0.9},
        {"step": 2, "loss": "nan?"},  # text under a number's key
        {"step": 3, "loss": None},
        {"step": 4, "loss": 0.5, "val": 2.0},  # a new key
        {"step": 5, "loss": 2**70},  # beyond 64 bits
        {"step": 6, "loss": 3},  # an int where floats were
        {"step": 7, "loss": 0.25},
    ]
    marked: dict[Any, Any] = {"step": 8, "loss": t}
    mark_unpacked(marked)
    for r in [*rows, marked]:
        log.put(r)
    got = _rows_of(log.take(log.writer, records))
    assert [g["step"] for g in got] == list(range(9))
    assert got[2]["loss"] == "nan?" and got[3]["loss"] is None and got[4]["val"] == 2.0
    assert got[5]["loss"] == 2**70 and got[6]["loss"] == 3 and got[8]["loss"] is t


def test_keys_that_change_every_step_stop_the_packing_for_a_block() -> None:
    log = StepLog(10_000, block_rows=16)
    for i in range(40):
        log.put({"step": i, f"k{i % 2}": 1.0})
    kinds = [b.codec is not None for b in log._blocks]
    assert kinds[:2] == [True, True] and not kinds[2]  # two 1-row packed blocks, then rows as they are
    assert len(log._blocks) < 10
    assert [r["step"] for r in _rows_of(log.take(log.writer, records))] == list(range(40))


def test_past_capacity_the_oldest_rows_go_and_are_counted() -> None:
    log = StepLog(100, block_rows=16)
    for i in range(1000):
        log.put({"step": i, "x": 1.0})
    assert log.waiting() <= 100 + 16 and sum(b.n for b in log._blocks) <= 100 + 2 * 16  # memory bounded
    got = [r["step"] for r in _rows_of(log.take(log.writer, records))]
    assert got == list(range(900, 1000)) and log.dropped == 900


def test_a_best_effort_reader_reads_every_row_and_never_holds_the_writer_back() -> None:
    log = StepLog(1000, block_rows=8)
    cur = log.cursor()
    for i in range(20):
        log.put({"step": i, "time": float(i), "tokens": 64})
    log.take(log.writer, records)
    n, cols = log.take(cur, lambda sp: numbers(sp, ("step", "time", "tokens", "absent")))
    assert n == 20 and cols["step"].tolist() == list(range(20)) and np.isnan(cols["absent"]).all()
    # a reader that never reads: blocks the writer has read are kept for it up to SPARE_ROWS, then let go
    spare = log.spare_blocks
    assert spare == 4096 // 8 + 2
    for i in range(20, 20 + 8 * (spare + 10)):
        log.put({"step": i, "time": float(i), "tokens": 64})
        log.take(log.writer, records)
    assert len(log._blocks) <= spare and cur.missed > 0
    n, cols = log.take(cur, lambda sp: numbers(sp, ("step",)))
    assert cols["step"][-1] == 19 + 8 * (spare + 10) and np.all(np.diff(cols["step"]) == 1)
    log.release(cur)


def test_a_reader_on_another_thread_gets_every_row_once_in_order() -> None:
    log = StepLog(1 << 20, block_rows=64)
    got: list[int] = []
    done = threading.Event()

    def read() -> None:
        while True:
            finished = done.is_set()
            got.extend(r["step"] for r in _rows_of(log.take(log.writer, records, 500)))
            if finished and not log.waiting():
                return

    t = threading.Thread(target=read)
    t.start()
    for i in range(50_000):
        row: dict[Any, Any] = {"step": i, "loss": 1.0}
        if i % 997 == 0:
            row["extra"] = "x"
        log.put(row)
    done.set()
    t.join(30)
    assert got == list(range(50_000)) and log.dropped == 0


_VALUES = st.one_of(st.floats(allow_nan=False), st.integers(-(2**70), 2**70), st.booleans(), st.none(),
                    st.text(max_size=3))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from("abcd"), unique=True, max_size=4),
                          st.lists(_VALUES, min_size=4, max_size=4)), max_size=60),
       st.integers(1, 9), st.lists(st.integers(1, 7), min_size=1, max_size=8))
def test_any_rows_come_back_as_they_were_put(spec: list[tuple[list[str], list[Any]]], block: int,
                                             limits: list[int]) -> None:
    log = StepLog(10_000, block_rows=block)
    rows = [{"step": i, **dict(zip(keys, values, strict=False))} for i, (keys, values) in enumerate(spec)]
    got: list[dict[Any, Any]] = []
    for i, r in enumerate(rows):
        log.put(dict(r))
        if i % 3 == 0:
            got += _rows_of(log.take(log.writer, records, limits[i % len(limits)]))
    got += _rows_of(log.take(log.writer, records))
    assert len(got) == len(rows)
    for g, r in zip(got, rows, strict=True):
        assert list(g) == list(r)
        for k, v in r.items():
            # an int under a key whose block began with a float comes back as a float (as a REAL column holds it)
            assert g[k] == v or (type(v) is int and abs(v) > 2**53 and g[k] == float(v)), (k, v, g[k])
            assert type(g[k]) is type(v) or {type(g[k]), type(v)} <= {int, bool, float}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(), st.integers(-(2**63), 2**63 - 1), st.booleans()), min_size=3,
                         max_size=3), min_size=1, max_size=40), st.integers(1, 9))
def test_a_packed_records_matrix_holds_its_rows_values_as_floats(values: list[list[Any]], block: int) -> None:
    """The columnar copy the writer keeps of packed rows is read from their bytes: the same floats the rows'
    values make (the writer used to build it with ``np.array(rows, dtype=float)``)."""
    log = StepLog(10_000, block_rows=block)
    for i, v in enumerate(values):
        log.put({"step": i, "a": v[0], "b": v[1], "c": v[2]})
    recs = log.take(log.writer, records)
    assert block < 8 or any(PACKED in r for r in recs)  # (blocks that close early, under 8 rows, stop packing)
    for rec in recs:
        packed = rec.get(PACKED)
        if packed is None:
            continue
        want = np.array([[float(x) for x in row] for row in packed.rows], dtype=float).reshape(len(packed.rows), -1)
        assert packed.matrix.shape == want.shape
        assert np.array_equal(packed.matrix, want, equal_nan=True)


def test_the_writer_stores_packed_and_unpacked_steps_in_order(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, flush_interval=3600, flush_rows=8)
    try:
        for i in range(100):
            row: dict[Any, Any] = {"step": i, "time": 1e9 + i, "duration_s": 0.01, "loss": 1.0 / (i + 1)}
            if i % 30 == 7:
                row["note"] = "eval"
            if i == 50:
                row["Step"] = 3.0  # a name of ours under another spelling: renamed, as the dict path does
            rec.put("steps", row)
        assert rec.flush()
    finally:
        rec.close()
    with sqlite3.connect(tmp_path / "rank0.db") as conn:
        got = conn.execute("SELECT rowid, step, loss, note FROM steps ORDER BY rowid").fetchall()
    assert [s for _, s, _, _ in got] == list(range(100)) and [r for r, *_ in got] == list(range(1, 101))
    assert [n for *_, n in got if n] == ["eval"] * 4 and got[99][2] == 1.0 / 100


def test_a_queued_row_holds_its_bytes_not_its_dict() -> None:
    """A writer that cannot keep up holds the rows it has not read: a packed row is its 8-byte values and a small
    ``bytes`` header, not the 1.1 KB of its dict and numbers."""
    log = StepLog(1_000_000, block_rows=64)
    keys = [f"scalar_{j}" for j in range(12)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            row: dict[str, Any] = {k: i * 0.5 + j for j, k in enumerate(keys)}
            row.update(step=i, time=1e9 + i, duration_s=0.01, samples=8, tokens=1024)
            log.put(row)
        held = (tracemalloc.get_traced_memory()[0] - before) / 20_000
    finally:
        tracemalloc.stop()
    assert log.waiting() == 20_000
    assert 17 * 8 <= held <= 17 * 8 + 64  # the values' bytes, a bytes header and a list slot
    got = _rows_of(log.take(log.writer, records))
    assert len(got) == 20_000 and got[-1]["step"] == 19_999 and got[-1]["scalar_11"] == 19_999 * 0.5 + 11


def test_a_row_of_the_blocks_keys_in_another_order_is_packed_in_its_order() -> None:
    log = StepLog(1000, block_rows=8)
    log.put({"step": 0, "loss": 1.0, "lr": 0.1})
    log.put({"lr": 0.2, "step": 1, "loss": 0.5})  # the same keys, logged in another order
    log.put({"step": 2, "loss": 0.25, "lr2": 0.3})  # as many keys, one of them another: a block of its own
    assert len(log._blocks) == 2 and log._blocks[0].n == 2
    got = _rows_of(log.take(log.writer, records))
    assert got == [{"step": 0, "loss": 1.0, "lr": 0.1}, {"step": 1, "loss": 0.5, "lr": 0.2},
                   {"step": 2, "loss": 0.25, "lr2": 0.3}]
