"""The SQL side of the writer: one rank's tables, their columns, and inserting batches.

:class:`TableWriter` creates the tables of :mod:`gpudash.store.schema`, adds a
dynamic table's new columns the first time a record carries them (all of a
batch's new columns in one schema change, see :mod:`gpudash.store.columns`),
inserts rows, and keeps the columnar copies and time roll-ups (written in
batches: :meth:`TableWriter.write_rollups`, :mod:`gpudash.store.chunks`). It
runs inside the transaction the :class:`~gpudash.store.writer.Recorder`
opens, and forgets what it learnt there when that is rolled back.

What a flush costs on disk: SQLite in WAL mode writes every page a
transaction touches, whole, into the log, and each page once more into the
database when the log is checkpointed. So :func:`connect` picks small pages
(:data:`PAGE_SIZE`), and a log of at most :data:`CHECKPOINT_BYTES` that is
checkpointed and reused from its start without ``fsync``
(:data:`SYNCHRONOUS`): the log's pages and the database's last pages, which
every flush rewrites, are rewritten in the page cache and reach the disk once
per kernel writeback (``vm.dirty_expire_centisecs``, 30 s by default), not
once per flush. A killed process loses nothing that was committed (the page
cache survives it); an OS crash or power cut may lose or damage what the
last ~30 s wrote, which the reader salvages around (tensorboardX and wandb
do not ``fsync`` either). Measured in ``benchmarks/store_bytes.py``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from gpudash.store.attempts import ATTEMPT_COLUMN
from gpudash.store.chunks import ChunkWriter
from gpudash.store.columns import add_columns, column_room, table_columns
from gpudash.store.rollup import Rollups
from gpudash.store.schema import (
    DYNAMIC_TABLES,
    NUMERIC_TABLES,
    ROLLUP_TABLES,
    TABLE_BASE_COLUMNS,
    column_name,
    is_reserved_column,
    namespaced_column,
    quote_ident,
)
from gpudash.store.steplog import PACKED, Packed
from gpudash.store.values import Unstorable, cell, num, sql_type, storable

__all__ = ["TABLE_TAG", "TableWriter", "connect"]

#: Rows converted between GIL hand-backs: the training thread never waits for a whole flush.
_SLICE = 4096
#: A queued record carries its table under this key (no column name is ``None``). A wrapping
#: ``(table, row)`` tuple would be one GC-tracked object per record: waiting for the next flush,
#: records reach the oldest GC generation and bring on full collections in the training thread.
#: A row of numbers is a dict that the GC does not track at all.
TABLE_TAG: Any = None
_BASE = {t: frozenset(c for c, _ in cols) for t, cols in TABLE_BASE_COLUMNS.items()}

#: Names remembered per table (a key's column name; the columns SQLite had no room for): a run that logs
#: ever-new names (``log(**{f"x{step}": ...})``) must not grow the writer's memory with them. Past this, a
#: name is worked out again in each batch that carries it.
MAX_NAMES = 4096

#: ``report(message, key=..., kind=...)``: say a problem once (see ``Recorder._report``)
Report = Callable[..., None]


_FAST_TYPES = frozenset({float, int, bool, type(None)})
_BIG = float(1 << 63)


def _plain_numbers(rows: list[tuple[Any, ...]]) -> np.ndarray | None:
    """``rows`` as a float matrix when every value is a number SQLite stores as it is (floats,
    bools, None, integers within 64 bits); None when some value needs :func:`cell`."""
    if not _FAST_TYPES.issuperset(map(type, chain.from_iterable(rows))):
        return None
    try:
        full = np.array(rows, dtype=float)
    except (TypeError, ValueError, OverflowError):
        return None
    if full.ndim != 2 or len(full) != len(rows):
        return None
    big = np.abs(full) >= _BIG  # an integer beyond 64 bits (or a float that large: the slow path is exact)
    if big.any() and (big & np.isfinite(full)).any():
        return None
    return full


#: Page size of a new database (an existing one keeps its own): pages touched per flush x this is
#: what a flush writes into the log; bigger pages read long chunk blobs with fewer hops.
PAGE_SIZE = 2048
#: Log size at which SQLite copies the log into the database (``wal_autocheckpoint``, set in pages):
#: small, so the log's pages are reused while they are still in the page cache.
CHECKPOINT_BYTES = 64 << 10
#: A log grown past this (a long reader held a checkpoint back) is cut back to it once checkpointed.
WAL_LIMIT_BYTES = 4 << 20
#: No ``fsync`` at checkpoints (see the module doc); commits in WAL mode never wait for one anyway.
SYNCHRONOUS = "OFF"
#: The writer's page cache, KiB: it only appends, touching the last pages of each table and index (a
#: reader's cache is :data:`~gpudash.store.schema.CACHE_KIB`). At 256 KiB it filled at the file's growth rate
#: over a run's first few thousand steps (~190 B/step of malloc's in-use bytes in the watched process over
#: steps 100-400 of a 1 ms loop); at 32 KiB (16 pages) it is full within the first second.
WRITER_CACHE_KIB = 32


#: Prepared statements the writer's connection keeps: none. A kept statement keeps the values it last ran
#: with, a chunk's blob among them (a table's 4,096 rows, ~260 KB of malloc'd memory in the watched process
#: from the first chunk to the end of the run, one per table); preparing the few statements of a flush again
#: costs a few µs on the writer's thread.
WRITER_STATEMENTS = 0


#: Rows one INSERT statement carries at most (see :func:`insert_rows`).
ROWS_PER_STATEMENT = 1024
#: Rows of a table a flush inserts with ``executemany`` (one prepared single-row statement): up to here the
#: writer keeps up row by row (a flush of 64 rows every 64 steps), and a statement of many rows would be parsed
#: and let go each flush (~100 KB of SQLite's program for 64 rows, held while the training thread runs).
EXECUTEMANY_ROWS = 256
#: Bound values one statement may carry where SQLite cannot say (``SQLITE_MAX_VARIABLE_NUMBER`` before 3.32).
_OLD_VARIABLE_LIMIT = 999


def insert_rows(conn: sqlite3.Connection, table: str, cols: str, one: str, width: int,
                data: list[tuple[Any, ...]]) -> int:
    """Insert ``data`` (rows of ``width`` values; ``one`` is a row's ``(?, ...)``) into ``table``'s ``cols``
    (quoted, comma-separated); the rowid of the first row inserted. Up to :data:`EXECUTEMANY_ROWS` rows
    with ``executemany``, more with statements of many rows each.

    Why not always ``executemany``: it lets go of the GIL at each row (SQLite's step), and a thread that lets go
    of the GIL while the training thread holds it (a loop of pure Python, numpy on small arrays) gets it back only
    at the interpreter's switch interval (5 ms): one row per 5 ms, ~200 rows a second, while such a loop queues
    thousands, so its batches grow past :data:`EXECUTEMANY_ROWS`. A statement of ``ROWS_PER_STATEMENT`` rows lets
    go of it a few times for all of them. SQLite parses each such statement anew (the writer keeps no prepared
    statement, see :data:`WRITER_STATEMENTS`): ~2 µs a row of 18 values, with the GIL let go."""
    head = f"INSERT INTO {quote_ident(table)} ({cols}) VALUES "
    if len(data) <= EXECUTEMANY_ROWS:
        first = (conn.execute(f"SELECT max(rowid) FROM {quote_ident(table)}").fetchone()[0] or 0) + 1
        conn.executemany(head + one, data)
        return int(first)
    getlimit, which = getattr(conn, "getlimit", None), getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", None)
    limit = getlimit(which) if getlimit is not None and which is not None else _OLD_VARIABLE_LIMIT  # (3.11+)
    per = max(1, min(ROWS_PER_STATEMENT, limit // max(width, 1)))
    first = 0
    for i in range(0, len(data), per):
        part = data[i:i + per]
        cur = conn.execute(head + ",".join([one] * len(part)), list(chain.from_iterable(part)))
        if not i:  # rows of one statement take consecutive rowids, after the table's last: the last is known
            first = int(cur.lastrowid or 0) - len(part) + 1
    return first


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30,
                           cached_statements=WRITER_STATEMENTS)
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # before WAL mode: a WAL database keeps its page size
    # before WAL mode too: switching a new file to WAL with the default (FULL) fsyncs it, 30-300 ms of the
    # first training step under `gpudash run` on a busy disk
    conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    conn.execute("PRAGMA journal_mode=WAL")
    page = int(conn.execute("PRAGMA page_size").fetchone()[0] or PAGE_SIZE)
    conn.execute(f"PRAGMA wal_autocheckpoint={max(16, CHECKPOINT_BYTES // page)}")
    conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    conn.execute(f"PRAGMA cache_size=-{WRITER_CACHE_KIB}")  # bounded, and full within the run's first steps
    return conn


class TableWriter:
    """Writes batches of records into one rank's database (inside the caller's transaction)."""

    def __init__(self, conn: sqlite3.Connection, report: Report, meta: dict[str, Any] | None = None,
                 attempt: int = 1) -> None:
        self._conn = conn
        #: the attempt every row written here belongs to; from 2 on each row carries it (:mod:`~gpudash.store.attempts`)
        self.attempt = int(attempt)
        self._report = report
        #: values left empty in the open transaction (the caller adds them up once it commits)
        self.txn_dropped_values = 0
        self._columns: dict[str, dict[str, str]] = {}
        self._colnames: dict[str, dict[Any, str]] = {t: {} for t in TABLE_BASE_COLUMNS}
        self._ignored: dict[str, set[str]] = {}  # columns SQLite refused to add (e.g. too many columns)
        conn.execute("BEGIN")  # the whole schema in one transaction: one write of each page, not one per table
        try:
            self._create_tables()
            if self.attempt > 1:
                self._add_attempt_column()
            self.chunks = ChunkWriter(conn)
            self.write_meta(meta or {})
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self.rollups = Rollups(conn)

    def begin(self) -> None:
        self.rollups.begin()
        self.chunks.begin()
        self.txn_dropped_values = 0

    def rollback(self) -> None:
        """The transaction was rolled back: undo what the caches learnt in it (added columns, roll-up
        sums, rows waiting for a chunk)."""
        self.rollups.rollback()
        self.chunks.rollback()
        try:
            for table in DYNAMIC_TABLES:
                cols = table_columns(self._conn, table)
                if cols:
                    self._columns[table] = cols
        except sqlite3.Error:
            pass

    def _create_tables(self) -> None:
        c = self._conn
        c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        for table, cols in TABLE_BASE_COLUMNS.items():
            body = ", ".join(f"{quote_ident(n)} {t}" for n, t in cols)
            c.execute(f"CREATE TABLE IF NOT EXISTS {quote_ident(table)} ({body})")
            self._columns[table] = {n: t for n, t in cols}
            if table in NUMERIC_TABLES:  # queried by time range; the others are read whole (by rowid)
                c.execute(f"CREATE INDEX IF NOT EXISTS {quote_ident(table + '_time')} ON {quote_ident(table)}(time)")
        c.execute('CREATE INDEX IF NOT EXISTS "steps_step" ON steps(step)')
        for table in DYNAMIC_TABLES:
            self._columns[table].update(table_columns(c, table))

    def _add_attempt_column(self) -> None:
        """Every table gets the ``attempt`` column (a run first recorded before any restart has none)."""
        for table in TABLE_BASE_COLUMNS:
            if ATTEMPT_COLUMN not in table_columns(self._conn, table):
                add_columns(self._conn, table, [(ATTEMPT_COLUMN, "INTEGER")])
            self._columns[table][ATTEMPT_COLUMN] = "INTEGER"

    def _ensure_columns(self, table: str, keys: dict[Any, str], rows: list[dict[Any, Any]]) -> None:
        """Add the columns first seen in ``rows``, all in one schema change."""
        known = self._columns[table]
        ignored = self._ignored.setdefault(table, set())
        new: dict[str, str] = {}
        for key, col in keys.items():
            if col in known or col in ignored or col in new:
                continue
            value = next((r[key] for r in rows if r.get(key) is not None), None)
            if value is not None:
                new[col] = sql_type(value)
        if not new:
            return
        defs = list(new.items())
        room = column_room(self._conn, len(known))
        if len(defs) > room:
            ignored.update(c for c, _ in defs[room:][:max(0, MAX_NAMES - len(ignored))])  # record the rest of the row
            self._report(f"writer: {table}.{defs[room][0]} and {len(defs) - room - 1} more cannot be added (too "
                         f"many columns: SQLite allows {len(known) + room}); their values are not recorded",
                         key=f"add column to {table}: too many columns")  # said once, not once per column
            defs = defs[:room]
        refused = add_columns(self._conn, table, defs)  # a failure "for now" raises: the caller retries
        for col, exc in refused.items():
            if len(ignored) < MAX_NAMES:
                ignored.add(col)
            self._report(f"writer: {table}.{col} cannot be added ({exc}); its values are not recorded",
                         key=f"add column to {table}: {exc}")
        known.update((c, t) for c, t in defs if c not in refused)

    def _column(self, table: str, key: Any) -> str:
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
            if len(cache) < MAX_NAMES:
                cache[key] = col
        return col

    def insert(self, table: str, rows: list[dict[Any, Any]]) -> None:
        """Insert ``rows`` in their order: dicts, and records of packed step rows
        (:data:`gpudash.store.steplog.PACKED`)."""
        if table not in self._columns:
            raise sqlite3.OperationalError(f"unknown table {table!r}")
        if table != "steps":
            self._insert_rows(table, rows)
            return
        start = 0
        for i, r in enumerate(rows):
            packed = r.get(PACKED)
            if packed is not None:
                if i > start:
                    self._insert_rows(table, rows[start:i])
                self._insert_packed(table, packed)
                start = i + 1
        if start < len(rows):
            self._insert_rows(table, rows[start:] if start else rows)

    def _insert_packed(self, table: str, packed: Packed) -> None:
        """Rows packed on the recording thread: each a tuple of plain numbers in ``packed.keys``' order."""
        keys, data = packed.keys, packed.rows
        if not data:
            return
        names = {k: self._column(table, k) for k in keys}
        self._ensure_columns(table, names, [dict(zip(keys, data[0], strict=True))])
        known = self._columns[table]
        # each column's value: the last key under it, as the dict path's; columns in the keys' order (an INSERT
        # names its columns: no tuple is rebuilt when every key is a column of its own)
        at = {c: i for i, c in enumerate(names.values()) if c in known and c != ATTEMPT_COLUMN}
        cols = list(at)
        if not cols:
            return
        idx = [at[c] for c in cols]
        matrix = packed.matrix
        if idx != list(range(len(keys))):
            pick = itemgetter(*idx)
            data = [pick(t) for t in data] if len(idx) > 1 else [(pick(t),) for t in data]
            matrix = matrix[:, idx]
        self._insert_tuples(table, cols, data, lambda part: [dict(zip(cols, t, strict=True)) for t in part], cols,
                            matrix)

    def _insert_rows(self, table: str, rows: list[dict[Any, Any]]) -> None:
        keys: dict[Any, str] = {}
        for i in range(0, len(rows), _SLICE):  # each key once, in first-seen order (C loops, per slice)
            keys.update(dict.fromkeys(chain.from_iterable(rows[i:i + _SLICE]), ""))
        keys.pop(TABLE_TAG, None)  # the table tag is no column
        for k in keys:
            keys[k] = self._column(table, k)
        if table in DYNAMIC_TABLES:
            self._ensure_columns(table, keys, rows)
        known = self._columns[table]
        by_col = {c: k for k, c in keys.items() if c in known}
        cols = [c for c in known if c in by_col and c != ATTEMPT_COLUMN]
        if not cols:
            return
        src = [by_col[c] for c in cols]
        self._insert_tuples(table, cols, rows, lambda part: part, src)

    def _insert_tuples(self, table: str, cols: list[str], rows: list[Any],
                       as_dicts: Callable[[list[Any]], list[dict[Any, Any]]], src: list[Any],
                       matrix: np.ndarray | None = None) -> None:
        """Insert ``rows`` into ``cols``: dicts read by the keys ``src`` (one per column), or tuples in the
        columns' order (``src`` then names the columns of the dicts ``as_dicts`` makes of them, for the values
        that need converting). ``matrix``: tuples of plain numbers (packed rows: ints within 64 bits, floats)
        with the same values as floats, stored as they are."""
        numeric = table in NUMERIC_TABLES
        known = self._columns[table]
        tuples = not rows or not isinstance(rows[0], dict)
        idx = [i for i, c in enumerate(cols) if known.get(c) in ("REAL", "INTEGER")] if numeric else []
        data: list[tuple[Any, ...]] = []
        arrays: list[np.ndarray] = []
        if matrix is not None:
            data, rows = rows, []  # (nothing to check or convert: see gpudash.store.steplog)
            arrays.append(matrix[:, idx])
        for i in range(0, len(rows), _SLICE):
            part = rows[i:i + _SLICE]
            if i:
                time.sleep(0)  # hand the GIL back to the training thread between slices
            if numeric:  # rows of plain numbers, as most are: checked a slice at a time, in C
                fast = part if tuples else [tuple(map(r.get, src)) for r in part]
                full = _plain_numbers(fast)
                if full is not None:
                    data += fast
                    arrays.append(full[:, idx])
                    continue
            if tuples:
                part = as_dicts(part)
            try:
                slow = [tuple([cell(r.get(k)) for k in src]) for r in part]
            except Unstorable:
                slow = [self._cells(table, r, src, cols) for r in part]
            data += slow
            if numeric:
                try:
                    arrays.append(np.array(slow, dtype=float)[:, idx].reshape(len(slow), len(idx)))
                except (TypeError, ValueError, OverflowError):
                    arrays.append(np.array([[num(row[j]) for j in idx] for row in slow], dtype=float)
                                  .reshape(len(slow), len(idx)))
        quoted = ", ".join(map(quote_ident, cols))
        marks = ", ".join("?" * len(cols))
        if self.attempt > 1:  # the attempt as a constant of the statement: nothing added per row in Python
            quoted += f", {ATTEMPT_COLUMN}"
            marks += f", {self.attempt}"
        first = insert_rows(self._conn, table, quoted, f"({marks})", len(cols), data)
        if numeric:
            names = [cols[j] for j in idx]
            arr = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
            if self.attempt > 1:
                names.append(ATTEMPT_COLUMN)
                arr = np.column_stack([arr, np.full(len(arr), float(self.attempt))])
            self.chunks.append(table, first, names, arr)
            if table in ROLLUP_TABLES:
                self.rollups.update(table, names, arr)

    def _cells(self, table: str, row: dict[Any, Any], src: list[Any], cols: list[str]) -> tuple[Any, ...]:
        """One row cell by cell: a value that cannot be stored is left empty and counted."""
        out = []
        for k, c in zip(src, cols, strict=False):
            try:
                out.append(cell(row.get(k)))
            except Unstorable as exc:
                out.append(None)
                self.txn_dropped_values += 1  # counted once the transaction commits
                self._report(f"writer: {table}.{c}: a value cannot be stored ({exc}); it is left empty",
                             key=f"value {table}.{c}")
        return tuple(out)

    def write_rollups(self) -> None:
        """Store the roll-up buckets changed since the last call (the caller decides how often)."""
        self.rollups.write()

    def write_chunks(self) -> None:
        """Write every table's rows that wait for a chunk (at close)."""
        self.chunks.write_all()

    def write_meta(self, meta: dict[str, Any]) -> None:
        if not meta:
            return
        rows = []
        for k, v in meta.items():
            try:
                rows.append((storable(str(k)), json.dumps(v, default=str)))
            except Exception as exc:  # noqa: BLE001 - one bad fact must not block the heartbeat
                self._report(f"writer: meta {k!r} not stored ({type(exc).__name__}: {exc})")
        self._conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", rows)
