"""Append-only, crash-safe writer of one rank's records.

The training thread only calls :meth:`Recorder.put` (a deque append). A daemon
thread drains the deque every ``flush_interval`` seconds into ``rankN.db``
(SQLite, WAL mode), keeps the time roll-ups current and writes a heartbeat, so
a reader can tell a live run from a killed one. When the buffer is full the
oldest record is dropped and counted; the count is recorded in the meta table.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from gpudash.store.chunks import ChunkWriter
from gpudash.store.rollup import Rollups
from gpudash.store.schema import (
    DYNAMIC_TABLES,
    NUMERIC_TABLES,
    RUN_META_FILE,
    TABLE_BASE_COLUMNS,
    column_name,
    rank_db_name,
)

__all__ = ["Recorder", "to_plain"]

#: Rows converted between GIL hand-backs: the training thread never waits for a whole flush.
_SLICE = 4096
#: Records per transaction.
_BATCH = 50_000


def to_plain(value: Any) -> Any:
    """Turn tensors and numpy scalars into plain Python values (off the hot path)."""
    if value is None or isinstance(value, (int, float, str, bytes, dict, list)):
        return value
    item = getattr(value, "item", None)
    if item is not None:
        try:
            if getattr(value, "numel", lambda: 1)() == 1:
                return item()
        except Exception:  # noqa: BLE001 - a broken tensor must not stop the writer
            return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _sql_type(value: Any) -> str:
    if isinstance(value, str):
        return "TEXT"
    if isinstance(value, (bytes, bytearray)):
        return "BLOB"
    return "REAL"


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA page_size=65536")  # big pages: short overflow chains for chunk blobs
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def write_run_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Write ``run.json`` atomically (tmp file + rename) if it does not exist yet."""
    path = run_dir / RUN_META_FILE
    if path.exists():
        return
    tmp = run_dir / f".{RUN_META_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps(meta, indent=1, default=str))
    try:
        os.link(tmp, path)  # atomic "create if absent" across ranks
    except FileExistsError:
        pass
    except OSError:
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Recorder:
    """Bounded buffer + background writer for one rank of one run."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int = 0,
        flush_interval: float = 0.5,
        capacity: int = 200_000,
        meta: dict[str, Any] | None = None,
    ) -> None:
        if flush_interval <= 0:
            raise ValueError("flush_interval must be > 0 seconds")
        if capacity < 1:
            raise ValueError("capacity must be >= 1 record")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.flush_interval = flush_interval
        self.capacity = capacity
        self.dropped = 0
        self.errors: list[str] = []
        self._meta_pending: dict[str, Any] = {}
        self._meta_lock = threading.Lock()
        self._buf: deque[tuple[str, dict[str, Any]]] = deque(maxlen=capacity)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._req_seq = 0  # flush requests made / served (see flush())
        self._done_seq = 0
        self._columns: dict[str, dict[str, str]] = {}
        self._colnames: dict[str, str] = {}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / rank_db_name(rank)
        self._conn = _connect(self.path)
        self._create_tables()
        self._rollups = Rollups(self._conn)
        self._chunks = ChunkWriter(self._conn)
        start = {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.time(),
            "status": "live",
            "heartbeat": time.time(),
            "flush_interval": flush_interval,
        }
        start.update(meta or {})
        self._write_meta(start)
        self._thread = threading.Thread(target=self._run, name=f"gpudash-writer-{rank}", daemon=True)
        self._thread.start()

    # ---- training-thread API (no I/O) -------------------------------------------------
    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue one record. Never blocks; drops the oldest record when full."""
        if len(self._buf) >= self.capacity:
            self.dropped += 1
        self._buf.append((table, row))

    def put_meta(self, **items: Any) -> None:
        """Queue run-level facts; kept apart from the bounded record buffer so they are never dropped."""
        with self._meta_lock:
            self._meta_pending.update(items)

    # ---- control ------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Ask the writer thread to flush now and wait until it has."""
        if not self._thread.is_alive():
            return False
        with self._flushed:
            self._req_seq += 1
            mine = self._req_seq
            self._wake.set()
            return self._flushed.wait_for(lambda: self._done_seq >= mine, timeout)

    def close(self, status: str = "finished", reason: str = "closed", timeout: float = 120.0) -> None:
        """Flush everything, record why the run ended, stop the thread."""
        if self._stop.is_set():
            return
        self.put_meta(status=status, end_reason=reason, ended_at=time.time())
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():  # pragma: no cover - writer stuck on a slow disk
            print(f"gpudash: writer for {self.path} did not finish within {timeout:.0f} s; "
                  f"{len(self._buf)} records not written", file=sys.stderr)
            return
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()
        except sqlite3.Error:
            pass

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    # ---- writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            stopping = self._stop.is_set()
            with self._flushed:
                serving = self._req_seq
            self._flush_once()
            with self._flushed:
                self._done_seq = serving
                self._flushed.notify_all()
            if stopping:
                return

    def _flush_once(self) -> None:
        """Drain the buffer in transactions of at most _BATCH records, so a long
        backlog is committed piece by piece; write meta and the heartbeat."""
        pop = self._buf.popleft
        while True:
            items: list[tuple[str, dict[str, Any]]] = []
            try:
                for _ in range(_BATCH):
                    items.append(pop())
            except IndexError:
                pass
            self._commit(items)
            if len(items) < _BATCH:
                return

    def _commit(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        by_table: dict[str, list[dict[str, Any]]] = {}
        with self._meta_lock:
            meta, self._meta_pending = self._meta_pending, {}
        for table, row in items:
            by_table.setdefault(table, []).append(row)
        meta["heartbeat"] = time.time()
        meta["dropped_records"] = self.dropped
        try:
            self._conn.execute("BEGIN")
            for table, rows in by_table.items():
                self._insert(table, rows)
            self._write_meta(meta)
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            with self._meta_lock:
                self._meta_pending = {**meta, **self._meta_pending}
            msg = f"writer: {exc}"
            if msg not in self.errors:
                self.errors.append(msg)
            self.dropped += len(items)

    def _create_tables(self) -> None:
        c = self._conn
        c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        for table, cols in TABLE_BASE_COLUMNS.items():
            body = ", ".join(f'"{n}" {t}' for n, t in cols)
            c.execute(f'CREATE TABLE IF NOT EXISTS "{table}" ({body})')
            self._columns[table] = {n: t for n, t in cols}
            if "time" in dict(cols):
                c.execute(f'CREATE INDEX IF NOT EXISTS "{table}_time" ON "{table}"(time)')
        c.execute('CREATE INDEX IF NOT EXISTS "steps_step" ON steps(step)')
        for table in DYNAMIC_TABLES:
            for _, name, ctype, *_ in c.execute(f'PRAGMA table_info("{table}")'):
                self._columns[table][name] = ctype

    def _ensure_columns(self, table: str, keys: dict[str, str], rows: list[dict[str, Any]]) -> None:
        known = self._columns[table]
        for key, col in keys.items():
            if col in known:
                continue
            value = next((r[key] for r in rows if r.get(key) is not None), None)
            if value is None:
                continue
            ctype = _sql_type(to_plain(value))
            self._conn.execute(f'ALTER TABLE "{table}" ADD COLUMN "{col}" {ctype}')
            known[col] = ctype

    def _column(self, key: str) -> str:
        col = self._colnames.get(key)
        if col is None:
            col = self._colnames[key] = column_name(key)
        return col

    def _insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        if table not in self._columns:
            raise sqlite3.OperationalError(f"unknown table {table!r}")
        keys: dict[str, str] = {}
        for r in rows:
            for k in r:
                if k not in keys:
                    keys[k] = self._column(k)
        if table in DYNAMIC_TABLES:
            self._ensure_columns(table, keys, rows)
        known = self._columns[table]
        by_col = {c: k for k, c in keys.items() if c in known}
        cols = [c for c in known if c in by_col]
        if not cols:
            return
        src = [by_col[c] for c in cols]
        quoted = ", ".join(f'"{c}"' for c in cols)
        marks = ", ".join("?" * len(cols))
        data: list[tuple[Any, ...]] = []
        for i in range(0, len(rows), _SLICE):
            data += [tuple([_cell(r.get(k)) for k in src]) for r in rows[i:i + _SLICE]]
            if i:
                time.sleep(0)  # hand the GIL back to the training thread between slices
        first = (self._conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0] or 0) + 1
        self._conn.executemany(f'INSERT INTO "{table}" ({quoted}) VALUES ({marks})', data)
        if table in NUMERIC_TABLES:
            numeric = [c for c in cols if self._columns[table].get(c) in ("REAL", "INTEGER")]
            idx = [cols.index(c) for c in numeric]
            try:
                arr = np.array(data, dtype=float)[:, idx]
            except (TypeError, ValueError):
                arr = np.array([[_num(row[i]) for i in idx] for row in data], dtype=float)
            arr = arr.reshape(len(data), len(numeric))
            self._chunks.append(table, first, numeric, arr)
            self._rollups.update(table, numeric, arr)

    def _write_meta(self, meta: dict[str, Any]) -> None:
        rows = [(k, json.dumps(v, default=str)) for k, v in meta.items()]
        self._conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


_PLAIN = frozenset({int, float, str, bytes, type(None)})


def _cell(value: Any) -> Any:
    if value.__class__ in _PLAIN:
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return to_plain(value)
