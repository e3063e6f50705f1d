"""Hostile run folders: each function turns a healthy run into one crafted case (issue 26).

Every case is written with plain ``sqlite3`` and file calls, as someone else's tool (or a person
with bad intent) would leave it. ``CASES`` maps a case to its maker and the words its one damage
line must hold (``None``: the run is valid, only hard to read, and no damage is expected).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gpudash.store.schema import quote_ident
from gpudash.store.writer import Recorder

ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
#: A column name that, pasted into ``SELECT "{col}" FROM ...``, turns the query into an endless one.
BREAKOUT = f'x" FROM ({ENDLESS}) --'
BIG = 200_000_000  # the sizes the issue tried (200 MB of text)


def healthy(path: Path, n: int = 30, name: str | None = None) -> Path:
    rec = Recorder(path, flush_interval=60, meta={"name": name or path.name})
    for i in range(n):
        rec.put("steps", {"step": i, "time": 1e9 + i, "duration_s": 0.1, "tokens": 10.0, "loss": 2.0 - i / n})
        rec.put("memory", {"step": i, "time": 1e9 + i, "allocated_bytes": 1e6 + i, "reserved_bytes": 2e6})
    rec.put("events", {"time": 1e9, "step": 0, "kind": "note", "message": "started", "data": None})
    rec.close()
    return path


def _db(run: Path) -> sqlite3.Connection:
    return sqlite3.connect(run / "rank0.db")


def events_recursive_view(run: Path) -> None:
    with _db(run) as c:
        c.execute("DROP TABLE events")
        c.execute(f"CREATE VIEW events AS SELECT x AS time, x AS step, 'k' AS kind, 'm' AS message, NULL AS data "
                  f"FROM ({ENDLESS})")


def meta_endless_view(run: Path) -> None:
    with _db(run) as c:
        c.execute("DROP TABLE meta")
        c.execute(f"CREATE VIEW meta AS SELECT 'k' || x AS key, '\"' || hex(randomblob(1000)) || '\"' AS value "
                  f"FROM ({ENDLESS})")


def column_breaks_quoting(run: Path) -> None:
    with _db(run) as c:
        c.execute(f"ALTER TABLE steps ADD COLUMN {quote_ident(BREAKOUT)} REAL")
        c.execute(f"UPDATE steps SET {quote_ident(BREAKOUT)} = 1.5 WHERE step = 3")


def run_json_fifo(run: Path) -> None:
    if (run / "run.json").exists():
        os.remove(run / "run.json")
    os.mkfifo(run / "run.json")


def run_json_495mb(run: Path) -> None:
    with open(run / "run.json", "wb") as f:  # sparse: 495 MB long, a few kB on disk
        f.write(b'{"name": "')
        f.truncate(495_000_000)


def rank_db_fifo(run: Path) -> None:
    os.mkfifo(run / "rank1.db")


def name_200mb(run: Path) -> None:
    with _db(run) as c:
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('name', ?)", (json.dumps("n" * BIG),))


def name_long_in_run_json(run: Path) -> None:
    (run / "run.json").write_text(json.dumps({"name": "N" * 5_000_000, "status": "finished"}))


def event_message_200mb(run: Path) -> None:
    with _db(run) as c:
        c.execute("INSERT INTO events (time, step, kind, message, data) VALUES (1e9, 1, 'note', ?, NULL)", ("m" * BIG,))


def event_message_1mb(run: Path) -> None:
    with _db(run) as c:
        c.execute("INSERT INTO events (time, step, kind, message, data) VALUES (1e9, 1, 'note', ?, NULL)",
                  ("m" * 1_000_000,))


def wide_table(run: Path) -> None:
    with _db(run) as c:  # one CREATE TABLE (2,000 ALTER TABLEs would take a minute)
        have = [r[1] for r in c.execute("PRAGMA table_info(steps)")]
        cols = [*map(quote_ident, have), *(quote_ident(f"w{i}") + " REAL" for i in range(2000 - len(have)))]
        c.execute("ALTER TABLE steps RENAME TO steps_narrow")
        c.execute(f"CREATE TABLE steps ({', '.join(cols)})")
        names = ", ".join(map(quote_ident, have))
        c.execute(f"INSERT INTO steps (rowid, {names}) SELECT rowid, {names} FROM steps_narrow")
        c.execute("DROP TABLE steps_narrow")


def colliding_prometheus_names(run: Path) -> None:
    with _db(run) as c:
        for table, col in (("memory", 'a"b_bytes'), ("memory", "a_b_bytes"), ("steps", "lr"),
                           ("steps", "learning_rate")):
            c.execute(f"ALTER TABLE {table} ADD COLUMN {quote_ident(col)} REAL")
            c.execute(f"UPDATE {table} SET {quote_ident(col)} = 0.001")


#: case -> (maker, words the damage line holds; None when the run is valid and only awkward)
CASES: dict[str, tuple[Callable[[Path], None], str | None]] = {
    "events_recursive_view": (events_recursive_view, "events is a view"),
    "meta_endless_view": (meta_endless_view, "meta is a view"),
    "column_breaks_quoting": (column_breaks_quoting, None),
    "run_json_fifo": (run_json_fifo, "run.json is a FIFO"),
    "run_json_495mb": (run_json_495mb, "run.json is 472.1 MiB"),
    "rank_db_fifo": (rank_db_fifo, "rank1.db is a FIFO"),
    "name_200mb": (name_200mb, "meta: name unreadable (a value over 32 MiB"),
    "name_long_in_run_json": (name_long_in_run_json, "name is 5,000,000 characters long; trimmed"),
    "event_message_200mb": (event_message_200mb, "table events is damaged (a value over 32 MiB"),
    "event_message_1mb": (event_message_1mb, "events.message value(s) longer than 65,536 characters; trimmed"),
    "wide_table": (wide_table, "table steps has 2,000 columns"),
    "colliding_prometheus_names": (colliding_prometheus_names, None),
}
