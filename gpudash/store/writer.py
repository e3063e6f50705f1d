"""Append-only, crash-safe writer of one rank's records.

The training thread only calls :meth:`Recorder.put` (a deque append). A daemon
thread drains the deque every ``flush_interval`` seconds into ``rankN.db``
(SQLite, WAL mode), keeps the time roll-ups current and writes a heartbeat, so
a reader can tell a live run from a killed one. When the buffer is full the
oldest record is dropped and counted; the count is recorded in the meta table.

Nothing a training loop logs stops the writer: a value SQLite cannot store is
stored another way (an integer beyond 64 bits as a float, a non-UTF-8 string
escaped) or dropped and counted (``dropped_values``); a write that fails
because the disk is full (or the file is locked, or unwritable for a while)
keeps its records in memory and is retried every flush until it succeeds;
any other failure loses only the records that cause it. Each problem is said
once: in :attr:`Recorder.errors`, on stderr, and as an event in the run.
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
    is_reserved_column,
    namespaced_column,
    quote_ident,
    rank_db_name,
)
from gpudash.store.sharedfs import Publisher, shared_mode

__all__ = ["Recorder", "to_plain"]

#: Rows converted between GIL hand-backs: the training thread never waits for a whole flush.
_SLICE = 4096
#: Records per transaction.
_BATCH = 50_000
#: A queued record carries its table under this key (no column name is ``None``). A wrapping
#: ``(table, row)`` tuple would be one GC-tracked object per record: waiting for the next flush,
#: records reach the oldest GC generation and bring on full collections in the training thread.
#: A row of numbers is a dict that the GC does not track at all.
_TABLE: Any = None
_Record = dict[Any, Any]
#: Failed transactions per flush spent on isolating the records that cannot be written.
_FAIL_BUDGET = 64
#: SQLite primary result codes that mean "not now" (disk full, I/O, locked, unwritable, out of memory):
#: the records are kept and retried. Any other error is the records' fault: they are isolated and dropped.
_TRANSIENT_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})  # BUSY LOCKED NOMEM READONLY IOERR FULL CANTOPEN PROTOCOL
_TRANSIENT_WORDS = ("disk is full", "disk i/o", "locked", "readonly", "unable to open", "out of memory")
_INT64 = 1 << 63
_BASE = {t: frozenset(c for c, _ in cols) for t, cols in TABLE_BASE_COLUMNS.items()}


class _Unstorable(Exception):
    """A value that SQLite cannot store in any form (the message says why)."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _TRANSIENT_CODES
    return any(w in str(exc).lower() for w in _TRANSIENT_WORDS)  # pragma: no cover - Python < 3.11


def to_plain(value: Any) -> Any:
    """Turn tensors and numpy scalars into plain Python values (off the hot path). Never raises:
    what cannot be converted becomes ``None``."""
    if value is None or isinstance(value, (int, float, str, bytes, dict, list)):
        return value
    try:
        return _plain(value)
    except _Unstorable:
        return None


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if item is not None:
        try:
            n = getattr(value, "numel", None) or getattr(value, "size", 1)
            n = n() if callable(n) else n
            if n == 1:
                return item()
        except Exception as exc:  # noqa: BLE001 - a broken tensor must not stop the writer
            raise _Unstorable(f"{type(value).__name__}.item() failed: {exc}") from None
        raise _Unstorable(f"a {type(value).__name__} of {n} values; log one number (e.g. .mean())")
    try:
        return float(value)
    except Exception:  # noqa: BLE001 - any object: store its text
        try:
            return str(value)
        except Exception as exc:  # noqa: BLE001
            raise _Unstorable(f"{type(value).__name__} has no number or text form ({exc})") from None


def _storable(value: Any) -> Any:
    """Slow path of :func:`_cell`: any value as something SQLite stores, or :class:`_Unstorable`."""
    try:
        if isinstance(value, (dict, list, tuple)):
            return json.dumps(value, default=str)
        if not isinstance(value, (bool, int, float, str, bytes, bytearray, memoryview)):
            value = _plain(value)
            if isinstance(value, (dict, list)):
                return json.dumps(value, default=str)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int):
            value = int(value)
            if -_INT64 <= value < _INT64:
                return value
            try:
                return float(value)  # beyond 64 bits: a float keeps the magnitude
            except OverflowError:
                raise _Unstorable(f"an integer of {value.bit_length()} bits is beyond any float") from None
        if isinstance(value, float):
            return float(value)
        if isinstance(value, str):
            value = str(value)
            try:
                value.encode("utf-8")
                return value
            except UnicodeEncodeError:  # lone surrogates: SQLite wants UTF-8
                return value.encode("utf-8", "backslashreplace").decode("utf-8")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if value is None:
            return None
        return float(value)  # e.g. numpy longdouble from .item()
    except _Unstorable:
        raise
    except Exception as exc:  # noqa: BLE001 - any value, any failure: say which
        raise _Unstorable(f"{type(value).__name__}: {type(exc).__name__}: {exc}") from None


def _sql_type(value: Any) -> str:
    try:
        value = _cell(value)
    except _Unstorable:
        return "REAL"
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
        #: values that could not be stored in any form (their cell is left empty; see errors)
        self.dropped_values = 0
        self._txn_dropped_values = 0
        self.errors: list[str] = []
        self._reported: set[str] = set()
        self._retry: list[_Record] = []  # records of a write that failed for now
        self._stalled = False  # a write failed for now in this flush: keep the rest for the next one
        self._failing: tuple[float, str] | None = None  # (since, message) while writes fail for now
        self._budget = _FAIL_BUDGET
        self._last_step: Any = None
        self._ignored: dict[str, set[str]] = {}  # columns SQLite refused to add (e.g. too many columns)
        self._meta_pending: dict[str, Any] = {}
        self._meta_lock = threading.Lock()
        self._buf: deque[_Record] = deque(maxlen=capacity)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._req_seq = 0  # flush requests made / served (see flush())
        self._done_seq = 0
        self._columns: dict[str, dict[str, str]] = {}
        self._publish_failed = False  # the last attempt to publish a copy failed
        self._colnames: dict[str, dict[str, str]] = {t: {} for t in TABLE_BASE_COLUMNS}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / rank_db_name(rank)
        # a run folder other hosts share: the live database on local storage, copies published here
        shared = shared_mode(self.run_dir)
        self._publisher = Publisher(self.path) if shared else None
        self._conn = _connect(self._publisher.live_path if self._publisher else self.path)
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
        if self._publisher is not None:
            start.update(shared_fs=shared, publish_interval=self._publisher.interval,
                         live_db=str(self._publisher.live_path))
        start.update(meta or {})
        self._write_meta(start)
        self._thread = threading.Thread(target=self._run, name=f"gpudash-writer-{rank}", daemon=True)
        self._thread.start()

    # ---- training-thread API (no I/O) -------------------------------------------------
    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue one record (the row is the writer's from now on). Never blocks; drops the
        oldest record when full."""
        if len(self._buf) >= self.capacity:
            self.dropped += 1
        row[_TABLE] = table
        self._buf.append(row)

    def put_meta(self, **items: Any) -> None:
        """Queue run-level facts; kept apart from the bounded record buffer so they are never dropped."""
        with self._meta_lock:
            self._meta_pending.update(items)

    # ---- control ------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Ask the writer thread to flush now and wait until it has. False when it could not
        (timeout, or writes failing for now: the records wait in memory, see ``errors``)."""
        if not self._thread.is_alive():
            return False
        with self._flushed:
            self._req_seq += 1
            mine = self._req_seq
            self._wake.set()
            done = self._flushed.wait_for(lambda: self._done_seq >= mine, timeout)
        return done and self._failing is None

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
        if self._retry:
            self.dropped += len(self._retry)
            print(f"gpudash: {len(self._retry)} records could not be written to {self.path} before it closed "
                  f"({self._failing[1] if self._failing else 'write failed'})", file=sys.stderr)
            self._retry = []
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()
        except sqlite3.Error:
            pass
        pub = self._publisher
        if pub is not None:
            if not self._publish_failed and pub.published_at > 0 and self.path.exists():
                pub.cleanup()  # the last copy holds everything
            else:
                print(f"gpudash: the last copy of {self.path} could not be published; every record is in "
                      f"{pub.live_path} (copy it there)", file=sys.stderr)

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
            try:
                self._flush_once()
            except BaseException as exc:  # noqa: BLE001 - the writer outlives anything a record does
                self._report(f"writer: unexpected {type(exc).__name__}: {exc}")
            if self._publisher is not None and (stopping or self._publisher.due()):
                self._publish()
            with self._flushed:
                self._done_seq = serving
                self._flushed.notify_all()
            if stopping:
                return

    def _publish(self) -> None:
        """Shared-filesystem mode: a consistent copy of the live database into the run folder."""
        assert self._publisher is not None
        try:
            self._publisher.publish(self._conn)
        except BaseException as exc:  # noqa: BLE001 - retried at the next interval; records stay local
            self._report(f"writer: cannot publish {self.path} ({type(exc).__name__}: {exc}); the live copy "
                         f"{self._publisher.live_path} keeps every record, retrying every "
                         f"{self._publisher.interval:g} s", key=f"publish: {type(exc).__name__}", event=False)
            self._publish_failed = True
            return
        self._publish_failed = False

    def _flush_once(self) -> None:
        """Drain the buffer in transactions of at most _BATCH records, so a long
        backlog is committed piece by piece; write meta and the heartbeat. Records
        of a write that failed for now go first; after such a failure the rest waits."""
        self._budget = _FAIL_BUDGET
        self._stalled = False
        retry, self._retry = self._retry, []
        pop = self._buf.popleft
        while True:
            items, retry = retry[:_BATCH], retry[_BATCH:]
            try:
                while len(items) < _BATCH:
                    items.append(pop())
            except IndexError:
                pass
            self._commit(items)
            if self._stalled:
                self._retry += retry
                return
            if len(items) < _BATCH and not retry:
                return

    def _commit(self, items: list[_Record]) -> None:
        """Write ``items`` in one transaction. A failure "for now" (disk full, ...) keeps them
        for the next flush; any other failure is narrowed down to the records that cause it."""
        if self._stalled:
            self._retry += items
            return
        by_table: dict[str, list[_Record]] = {}
        with self._meta_lock:
            meta, self._meta_pending = self._meta_pending, {}
        for row in items:
            by_table.setdefault(row.get(_TABLE, "?"), []).append(row)
        meta["heartbeat"] = time.time()
        meta["dropped_records"] = self.dropped
        steps = by_table.get("steps")
        if steps:
            self._last_step = steps[-1].get("step", self._last_step)
        try:
            self._rollups.begin()
            self._conn.execute("BEGIN")
            self._txn_dropped_values = 0
            for table, rows in by_table.items():
                self._insert(table, rows)
            if self.dropped_values or self._txn_dropped_values:
                meta["dropped_values"] = self.dropped_values + self._txn_dropped_values
            self._write_meta(meta)
            self._conn.execute("COMMIT")
            self.dropped_values += self._txn_dropped_values
        except BaseException as exc:  # noqa: BLE001 - whatever failed, the transaction is undone
            self._rollback()
            with self._meta_lock:
                self._meta_pending = {**meta, **self._meta_pending}
            if _transient(exc):
                self._write_failed(exc, items)
            elif not items:
                self._report(f"writer: {type(exc).__name__}: {exc}")
            elif len(items) == 1 or self._budget <= 0:
                self.dropped += len(items)
                self._report(f"writer: {len(items)} record(s) of {items[0].get(_TABLE)} not written "
                             f"({type(exc).__name__}: {exc})", key=f"writer: {type(exc).__name__}: {exc}")
            else:
                self._budget -= 1
                mid = len(items) // 2
                self._commit(items[:mid])
                self._commit(items[mid:])
            return
        if self._failing is not None:
            self._write_resumed()

    def _rollback(self) -> None:
        """Undo the open transaction, and what the caches learnt in it (added columns, roll-up sums)."""
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite may have rolled back already (e.g. on a full disk)
        self._rollups.rollback()
        try:
            for table in DYNAMIC_TABLES:
                cols = {name: ctype for _, name, ctype, *_ in self._conn.execute(f"PRAGMA table_info({quote_ident(table)})")}
                if cols:
                    self._columns[table] = cols
        except sqlite3.Error:
            pass

    def _write_failed(self, exc: BaseException, items: list[_Record]) -> None:
        """A write failed for now: keep the records (bounded by ``capacity``) and say so once."""
        self._stalled = True
        self._retry += items
        over = len(self._retry) + len(self._buf) - self.capacity
        if over > 0:
            del self._retry[:over]
            self.dropped += over
        if self._failing is None:
            self._failing = (time.time(), f"{type(exc).__name__}: {exc}")
            self._report(f"writer: cannot write {self.path} ({exc}); keeping up to {self.capacity} records in "
                         f"memory and retrying every {self.flush_interval:g} s (free space to resume)",
                         key=f"writer: cannot write ({exc})", event=False)

    def _write_resumed(self) -> None:
        assert self._failing is not None
        since, why = self._failing
        self._failing = None
        msg = (f"could not write for {time.time() - since:.1f} s ({why}); writing resumed, "
               f"{self.dropped} records dropped so far")
        print(f"gpudash: {self.path}: {msg}", file=sys.stderr)
        self.put("events", {"time": since, "step": self._last_step, "kind": "write_error", "message": msg,
                            "data": {"error": why, "dropped_records": self.dropped}})

    def _report(self, msg: str, *, key: str | None = None, event: bool = True, kind: str = "write_error") -> None:
        """Say a problem once: in ``errors``, on stderr and (if it can be written) as an event."""
        key = msg if key is None else key
        if key in self._reported:
            return
        self._reported.add(key)
        self.errors.append(msg)
        print(f"gpudash: {self.path.name}: {msg}", file=sys.stderr)
        if event:
            self.put("events", {"time": time.time(), "step": self._last_step, "kind": kind,
                                "message": msg, "data": None})

    def _value_dropped(self, table: str, col: str, why: str) -> None:
        self._txn_dropped_values += 1  # counted once the transaction commits
        self._report(f"writer: {table}.{col}: a value cannot be stored ({why}); it is left empty",
                     key=f"value {table}.{col}")

    def _create_tables(self) -> None:
        c = self._conn
        c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        for table, cols in TABLE_BASE_COLUMNS.items():
            body = ", ".join(f"{quote_ident(n)} {t}" for n, t in cols)
            c.execute(f"CREATE TABLE IF NOT EXISTS {quote_ident(table)} ({body})")
            self._columns[table] = {n: t for n, t in cols}
            if "time" in dict(cols):
                c.execute(f"CREATE INDEX IF NOT EXISTS {quote_ident(table + '_time')} ON {quote_ident(table)}(time)")
        c.execute('CREATE INDEX IF NOT EXISTS "steps_step" ON steps(step)')
        for table in DYNAMIC_TABLES:
            for _, name, ctype, *_ in c.execute(f"PRAGMA table_info({quote_ident(table)})"):
                self._columns[table][name] = ctype

    def _ensure_columns(self, table: str, keys: dict[Any, str], rows: list[_Record]) -> None:
        """Add the columns first seen in ``rows``. The cache is re-read from the file on rollback."""
        known = self._columns[table]
        ignored = self._ignored.setdefault(table, set())
        for key, col in keys.items():
            if col in known or col in ignored:
                continue
            value = next((r[key] for r in rows if r.get(key) is not None), None)
            if value is None:
                continue
            ctype = _sql_type(value)
            try:
                self._conn.execute(f"ALTER TABLE {quote_ident(table)} ADD COLUMN {quote_ident(col)} {ctype}")
            except sqlite3.Error as exc:
                if _transient(exc):
                    raise
                ignored.add(col)  # e.g. "too many columns": record the rest of the row
                self._report(f"writer: {table}.{col} cannot be added ({exc}); its values are not recorded",
                             key=f"add column to {table}: {exc}")  # said once, not once per column
                continue
            known[col] = ctype

    def _column(self, table: str, key: str) -> str:
        cache = self._colnames[table]
        col = cache.get(key)
        if col is None:
            col = column_name(key)
            # a name the reader adds or the roll-ups use, or one of the table's own under another
            # spelling ("Step"): renamed, said once (the hot path checks nothing per name)
            if table in DYNAMIC_TABLES and (is_reserved_column(col) or (col in _BASE[table] and key != col)):
                new = namespaced_column(col)
                self._report(f"{table}: {key[:60]!r} is a name gpudash uses itself; recorded as {new!r} "
                             f"(rename it to silence this)", kind="reserved_name")
                col = new
            cache[key] = col
        return col

    def _insert(self, table: str, rows: list[_Record]) -> None:
        if table not in self._columns:
            raise sqlite3.OperationalError(f"unknown table {table!r}")
        keys: dict[Any, str] = {_TABLE: ""}  # seeded: the table tag is no column
        for r in rows:
            for k in r:
                if k not in keys:
                    keys[k] = self._column(table, k)
        del keys[_TABLE]
        if table in DYNAMIC_TABLES:
            self._ensure_columns(table, keys, rows)
        known = self._columns[table]
        by_col = {c: k for k, c in keys.items() if c in known}
        cols = [c for c in known if c in by_col]
        if not cols:
            return
        src = [by_col[c] for c in cols]
        quoted = ", ".join(map(quote_ident, cols))
        marks = ", ".join("?" * len(cols))
        data: list[tuple[Any, ...]] = []
        for i in range(0, len(rows), _SLICE):
            part = rows[i:i + _SLICE]
            try:
                data += [tuple([_cell(r.get(k)) for k in src]) for r in part]
            except _Unstorable:
                data += [self._cells(table, r, src, cols) for r in part]
            if i:
                time.sleep(0)  # hand the GIL back to the training thread between slices
        first = (self._conn.execute(f"SELECT max(rowid) FROM {quote_ident(table)}").fetchone()[0] or 0) + 1
        self._conn.executemany(f"INSERT INTO {quote_ident(table)} ({quoted}) VALUES ({marks})", data)
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

    def _cells(self, table: str, row: dict[str, Any], src: list[str], cols: list[str]) -> tuple[Any, ...]:
        """One row cell by cell: a value that cannot be stored is left empty and counted."""
        out = []
        for k, c in zip(src, cols, strict=False):
            try:
                out.append(_cell(row.get(k)))
            except _Unstorable as exc:
                out.append(None)
                self._value_dropped(table, c, str(exc))
        return tuple(out)

    def _write_meta(self, meta: dict[str, Any]) -> None:
        rows = []
        for k, v in meta.items():
            try:
                rows.append((_storable(str(k)), json.dumps(v, default=str)))
            except Exception as exc:  # noqa: BLE001 - one bad fact must not block the heartbeat
                self._report(f"writer: meta {k!r} not stored ({type(exc).__name__}: {exc})")
        self._conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _cell(value: Any) -> Any:
    """A value as SQLite stores it (hot loop of the writer: plain values return at once)."""
    cls = value.__class__
    if cls is float or value is None or cls is bytes:
        return value
    if cls is int:
        if -_INT64 <= value < _INT64:
            return value
    elif cls is str and value.isascii():
        return value
    return _storable(value)
