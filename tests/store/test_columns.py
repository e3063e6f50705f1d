"""Many new scalar names in one flush: added in a bounded number of schema statements (O(N), not O(N^2))."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

import gpudash
from gpudash.store import columns
from gpudash.store.writer import Recorder


def _record(path: Path, names: int, steps: int = 3) -> tuple[Counter[str], list[str]]:
    """Write ``steps`` rows logging ``names`` new scalars; count the schema statements of that flush."""
    rec = Recorder(path, flush_interval=60)
    assert rec.flush()  # the start-up meta is written: what follows is the flush of the new names
    seen: Counter[str] = Counter()

    def trace(sql: str) -> None:
        head = sql.lstrip().upper()
        if head.startswith("ALTER TABLE"):
            seen["alter"] += 1
        elif head.startswith("PRAGMA TABLE_INFO"):
            seen["table_info"] += 1
        elif "SQLITE_MASTER" in head or "SQLITE_SCHEMA" in head:
            seen["schema_read_or_edit"] += 1

    rec._conn.set_trace_callback(trace)
    for s in range(steps):
        rec.put("steps", {"step": s, "time": 1.0 + s, "duration_s": 0.1,
                          **{f"metric_{i}": float(i + s) for i in range(names)}})
    assert rec.flush(timeout=60)
    rec._conn.set_trace_callback(None)
    errors = list(rec.errors)
    rec.close()
    return seen, errors


def test_700_new_scalars_cost_a_bounded_number_of_schema_statements(tmp_path: Path) -> None:
    few, _ = _record(tmp_path / "few", 20)
    many, errors = _record(tmp_path / "many", 700)
    assert many["alter"] == 0  # one schema change for the new columns, not one ALTER per column
    assert many == few  # the count does not grow with the number of names
    assert many["table_info"] <= 9 and many["schema_read_or_edit"] <= 9  # 3 tables, a few each
    # every value lands and reads back through the ordinary reader (the steps table is not rolled up: a
    # roll-up of 700 scalars, 3 columns each, would not fit SQLite's 2,000 columns)
    run = gpudash.load_run(tmp_path / "many")
    steps = run.steps
    assert list(steps["step"]) == [0, 1, 2]
    for i in (0, 350, 699):
        assert list(steps[f"metric_{i}"]) == [float(i), i + 1.0, i + 2.0]
    assert run._reader is not None
    frame, level = run._reader.read_range("steps", max_rows=1)
    assert level == 0 and list(frame["metric_0"]) == [0.0, 1.0, 2.0]
    run.close()
    assert not [e for e in errors if "cannot be added" in e]  # 703 columns fit the raw table
    with sqlite3.connect(tmp_path / "many" / "rank0.db") as conn:  # a plain SQLite database, intact
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT metric_699 FROM steps WHERE step = 2").fetchone()[0] == 701.0


def test_a_refused_schema_edit_is_undone_and_the_columns_are_added_one_by_one(tmp_path: Path) -> None:
    """As under SQLite's defensive mode: the schema table is rewritten, then setting the schema version is
    refused; the rewrite is undone and ALTER TABLE adds the columns."""
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (a REAL)")
    conn.execute("INSERT INTO t VALUES (1.0)")

    def deny_schema_writes(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_PRAGMA and arg1 == "schema_version" and arg2 is not None:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    conn.set_authorizer(deny_schema_writes)
    before = Counter(columns.STATS)
    conn.execute("BEGIN")
    refused = columns.add_columns(conn, "t", [("b", "REAL"), ("c", "TEXT")])
    conn.execute("INSERT INTO t VALUES (2.0, 3.0, 'x')")
    conn.execute("COMMIT")
    assert refused == {}
    assert columns.STATS["schema_edit"] - before["schema_edit"] == 1
    assert columns.STATS["alter"] - before["alter"] == 2  # the fallback
    assert conn.execute("PRAGMA writable_schema").fetchone()[0] == 0
    assert conn.execute("SELECT * FROM t ORDER BY a").fetchall() == [(1.0, None, None), (2.0, 3.0, "x")]
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "setlimit"), reason="Connection.setlimit needs Python 3.11")
def test_columns_beyond_the_limit_are_refused_before_the_schema_is_written(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    conn.execute("CREATE TABLE t (a REAL)")
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, 5)
    assert columns.column_room(conn, 1) == 3  # one kept for the rowid a reader selects with them
    conn.execute("BEGIN")
    # a caller that ignores the room: the edit does not parse back, is undone, and the ALTERs say why
    refused = columns.add_columns(conn, "t", [(f"c{i}", "REAL") for i in range(6)])
    conn.execute("COMMIT")
    assert sorted(refused) == ["c4", "c5"] and "too many columns" in str(refused["c4"])
    assert list(columns.table_columns(conn, "t")) == ["a", "c0", "c1", "c2", "c3"]
    conn.close()
    with sqlite3.connect(tmp_path / "t.db") as again:
        assert again.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_reader_that_already_read_the_schema_sees_the_new_columns(tmp_path: Path) -> None:
    writer = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (a REAL)")
    writer.execute("INSERT INTO t VALUES (1.0)")
    reader = sqlite3.connect(tmp_path / "t.db")
    assert reader.execute("SELECT * FROM t").fetchall() == [(1.0,)]  # its schema is cached now
    writer.execute("BEGIN")
    assert columns.add_columns(writer, "t", [(f"c{i}", "REAL") for i in range(50)]) == {}
    writer.execute("INSERT INTO t (a, c49) VALUES (2.0, 3.0)")
    writer.execute("COMMIT")
    assert reader.execute("SELECT a, c0, c49 FROM t ORDER BY a").fetchall() == [(1.0, None, None), (2.0, None, 3.0)]
    assert [r[1] for r in reader.execute("PRAGMA table_info(t)")][-1] == "c49"
    reader.close()
    writer.close()
