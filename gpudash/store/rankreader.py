"""One rank's database, read while it is written or long after it crashed: its meta, its tables,
and the bounded questions the pages, the API and ``/metrics`` ask of it.

Every query goes through :meth:`RankReader.query` (real tables only, a deadline, damage noted):
no module outside ``gpudash.store`` holds SQL (tests/test_layers.py).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudash.store import bounded
from gpudash.store.bounded import count_trimmed, damage, is_interrupt, real_tables, trimmed_column
from gpudash.store.chunks import CHUNK_TABLE, read_chunks
from gpudash.store.meta import clean_meta
from gpudash.store.rankfile import Scratch, log_heartbeat, open_rank_db, wal_path
from gpudash.store.schema import TABLE_BASE_COLUMNS, quote_ident, rank_from_db_name, rollup_table

__all__ = ["MAX_COLUMNS", "STALE_AFTER_S", "RankReader", "merged_span", "meta_status", "time_where"]

#: A writer that has not written a heartbeat for this long (and at least 4
#: flush intervals) is treated as dead: its run reads ``crashed``.
STALE_AFTER_S = 3.0
_SALVAGE_BLOCK = 2048
#: Columns read of one table at most (gpudash's own first); SQLite's own limit is 2,000 per result.
MAX_COLUMNS = 1000
#: Keys read of a rank's meta table at most, and the longest value kept (gpudash writes a few kB).
META_ROWS = 10_000
META_VALUE_CHARS = 1 << 20



def _file_identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def meta_status(meta: dict[str, Any], now: float | None = None) -> str:
    """A rank's status from its meta: ``live`` while its heartbeat is fresh and its process (on this host)
    alive, else what it says (``finished``, ``crashed``), a stale ``live`` being ``crashed``."""
    status = str(meta.get("status", "crashed"))
    if status != "live":
        return status
    now = time.time() if now is None else now
    try:
        stale = max(STALE_AFTER_S, 4 * float(meta.get("flush_interval") or 0.5),
                    3 * float(meta.get("publish_interval") or 0.0))  # published copies lag by up to one interval
        beat = float(meta.get("heartbeat") or 0)
    except (TypeError, ValueError):
        return "crashed"  # a heartbeat that is not a time says nothing is alive
    if now - beat > stale:
        return "crashed"
    pid = meta.get("pid")
    if meta.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return "crashed"
    return "live"


class RankReader:
    """One rank's database."""

    def __init__(self, path: Path, *, live_log: bool = True) -> None:
        self.path = path
        #: whether the file's write-ahead log is its writer's (its mtime a heartbeat); False for a private
        #: copy of published segments (:mod:`gpudash.store.mirror`), whose meta carries the heartbeat
        self.live_log = live_log
        self.rank = rank_from_db_name(path.name) or 0
        self.problems: list[str] = []
        self._columns: dict[str, list[str]] = {}
        self._schema_version: int | None = None
        self._tables: set[str] | None = None
        self._not_tables: set[str] = set()
        self._scratch = Scratch()
        # no log beside it: opened immutable; a published copy (shared-filesystem mode) is replaced by rename
        self._identity = None if wal_path(path).exists() else _file_identity(path)
        try:
            self.conn = open_rank_db(path, self._scratch, self._note)
        except BaseException:
            self._scratch.cleanup()
            raise

    def close(self) -> None:
        self.conn.close()
        self._scratch.cleanup()

    def _note(self, msg: str) -> None:
        if msg not in self.problems:
            self.problems.append(msg)

    # ---- meta ---------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if not self.has_table("meta"):
            return out
        # bounded: at most META_ROWS keys, a value over META_VALUE_CHARS is not even handed to Python
        sql = (f"SELECT substr(key, 1, 200), CASE WHEN length(value) > {META_VALUE_CHARS} THEN NULL ELSE value END,"
               f" length(value) FROM meta LIMIT {META_ROWS + 1}")
        try:
            rows = self.conn.execute(sql).fetchall()
        except sqlite3.DataError:  # a value over the length limit: read key by key, name the ones lost
            rows = self._meta_by_row(sql)
        except (sqlite3.DatabaseError, MemoryError) as exc:
            self._note(f"{self.path.name}: meta table unreadable ({damage(exc)})")
            rows = []
        if len(rows) > META_ROWS:
            self._note(f"{self.path.name}: meta table holds over {META_ROWS:,} keys; read the first {META_ROWS:,}")
        for key, value, size in rows[:META_ROWS]:
            if not isinstance(key, str):
                continue
            if value is None and isinstance(size, int) and size > META_VALUE_CHARS:
                self._note(f"{self.path.name} meta: {key[:40]} is {size:,} characters long, over the "
                           f"{META_VALUE_CHARS:,} kept; ignored")
                continue
            try:
                out[key] = json.loads(value)
            except (TypeError, ValueError, RecursionError, MemoryError):
                out[key] = value
        meta = clean_meta(out, f"{self.path.name} meta", self.problems)
        beat = log_heartbeat(self.path) if self.live_log else None  # newer than the stored heartbeat while the writer lives
        if beat is not None and beat > float(meta.get("heartbeat") or 0):
            meta["heartbeat"] = min(beat, time.time())  # a log stamped in the future is not a writer seen then
        return meta

    def _meta_by_row(self, sql: str) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        one = sql.replace(" FROM meta ", " FROM meta WHERE rowid = ? ")
        for (rowid,) in self.query(f"SELECT rowid FROM meta LIMIT {META_ROWS + 1}", tables=("meta",)) or []:
            try:
                rows += self.conn.execute(one, (rowid,)).fetchall()
            except (sqlite3.DatabaseError, MemoryError) as exc:
                key = self.query("SELECT substr(key, 1, 40) FROM meta WHERE rowid = ?", (rowid,), tables=("meta",))
                name = key[0][0] if key and isinstance(key[0][0], str) else f"the key in row {rowid}"
                self._note(f"{self.path.name} meta: {name} unreadable ({damage(exc)}); ignored")
        return rows

    def status(self, meta: dict[str, Any] | None = None, now: float | None = None) -> str:
        return meta_status(self.meta() if meta is None else meta, now)

    # ---- tables -------------------------------------------------------------------------
    def tables(self) -> set[str]:
        """The file's real tables (views and triggers are someone else's code: never run)."""
        if self._tables is None:
            try:
                self._tables = real_tables(self.conn)
            except (sqlite3.DatabaseError, MemoryError) as exc:
                self._note(f"{self.path.name}: table list unreadable ({damage(exc)}); nothing of it read")
                self._tables = set()
        return self._tables

    def has_table(self, table: str) -> bool:
        """Whether ``table`` is a real table of the file; a view or trigger under its name is noted."""
        if table in self.tables():
            return True
        if table in self._not_tables:
            return False
        self._not_tables.add(table)
        try:
            row = self.conn.execute("SELECT type FROM sqlite_master WHERE name = ? AND type != 'table' LIMIT 1",
                                    (table,)).fetchone()
        except (sqlite3.DatabaseError, MemoryError):
            row = None
        if row is not None:
            self._note(f"{self.path.name}: {table} is a {str(row[0])[:20]}, not a table; not read "
                       "(a run file holds tables only)")
        return False

    def query(self, sql: str, params: tuple[Any, ...] | list[Any] = (), *, tables: tuple[str, ...],
              what: str = "") -> list[tuple[Any, ...]] | None:
        """Rows of ``sql`` over ``tables`` (all real tables, else None without running it); a query
        that fails, runs out of memory or over its deadline is noted (when ``what`` names it) and gives None."""
        if not all(self.has_table(t) for t in tables):
            return None
        try:
            return self.conn.execute(sql, params).fetchall()
        except (sqlite3.DatabaseError, MemoryError) as exc:
            if what or is_interrupt(exc) or isinstance(exc, MemoryError):
                self._note(f"{self.path.name}: {what or tables[0]} unreadable ({damage(exc)})")
            return None

    def columns(self, table: str) -> list[str]:
        cols = self._columns.get(table)
        if cols is None:
            cols = []
            if self.has_table(table):
                try:
                    cols = [r[1] for r in self.conn.execute(f"PRAGMA table_info({quote_ident(table)})")
                            if isinstance(r[1], str)]
                except (sqlite3.DatabaseError, MemoryError) as exc:
                    self._note(f"{self.path.name}: table {table} unreadable ({damage(exc)})")
                    cols = []
            cols = self._fit_columns(table, cols)
            if cols:
                self._columns[table] = cols
        return cols

    def _fit_columns(self, table: str, cols: list[str]) -> list[str]:
        """At most :data:`MAX_COLUMNS` of a table's columns, gpudash's own first, the rest in file order."""
        if len(cols) <= MAX_COLUMNS:
            return cols
        base = [c for c, _ in TABLE_BASE_COLUMNS.get(table, ())] + ["bucket", "n"]
        keep = [c for c in cols if c in base]
        keep += [c for c in cols if c not in keep][:MAX_COLUMNS - len(keep)]
        kept = set(keep)
        self._note(f"{self.path.name}: table {table} has {len(cols):,} columns; read {len(keep):,} of them "
                   f"(gpudash's own and the first others), {len(cols) - len(keep):,} left out")
        return [c for c in cols if c in kept]

    def reopen_if_replaced(self) -> bool:
        """An immutable file replaced since it was opened (a newer published copy, see
        :mod:`gpudash.store.sharedfs`): read the newer one. Rowids only grow, so cursors stay valid."""
        if self._identity is None:
            return False
        now = _file_identity(self.path)
        if now is None or now == self._identity:
            return False
        try:
            conn = open_rank_db(self.path, self._scratch, self._note)
        except sqlite3.DatabaseError:
            return False  # keep reading the copy we have
        self.conn.close()
        self.conn, self._identity, self._schema_version = conn, now, None
        self._columns.clear()
        self._tables = None
        return True

    def refresh_columns(self) -> None:
        """Forget cached column lists if the writer added columns since (cheap check)."""
        self.reopen_if_replaced()
        try:
            version = self.conn.execute("PRAGMA schema_version").fetchone()[0]
        except sqlite3.DatabaseError:
            version = None
        if version != self._schema_version:
            self._schema_version = version
            self._columns.clear()
            self._tables = None
            self._not_tables.clear()

    def max_rowid(self, table: str) -> int:
        """Largest rowid, or 0 when unknown (empty, damaged or not a table)."""
        rows = self.query(f"SELECT max(rowid) FROM {quote_ident(table)}", tables=(table,))
        try:
            return int(rows[0][0] or 0) if rows else 0
        except (TypeError, ValueError):
            return 0

    def read(self, table: str, where: str = "", params: tuple[Any, ...] = (), after_rowid: int = 0,
             limit: int | None = None) -> pd.DataFrame:
        """Rows of ``table`` (with a ``_rowid`` column) matching ``where``; salvages damaged tables."""
        cols, rows = self.read_rows(table, where, params, after_rowid, limit)
        if not cols:
            return pd.DataFrame()
        if not rows:  # most tables of most ranks: no record-building or trimmed-text scan for nothing
            return pd.DataFrame(columns=["_rowid", *cols])
        df = pd.DataFrame.from_records(rows, columns=["_rowid", *cols])
        self._note_trimmed(table, df)
        return df

    def read_rows(self, table: str, where: str = "", params: tuple[Any, ...] = (), after_rowid: int = 0,
                  limit: int | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """:meth:`read` as (column names, row tuples whose first item is the rowid), no DataFrame: for a
        watcher that looks often at few new rows (gpudash.alerts.watch)."""
        cols = self.columns(table)
        if not cols:
            return [], []
        cond = ["rowid > ?"] + ([where] if where else [])
        sql_cols = ", ".join(["rowid", *map(trimmed_column, cols)])
        sql = f'SELECT {sql_cols} FROM {quote_ident(table)} WHERE {" AND ".join(cond)} ORDER BY rowid'
        if limit:
            sql += f" LIMIT {int(limit)}"
        try:
            rows = self.conn.execute(sql, (after_rowid, *params)).fetchall()
        except MemoryError:
            self._note(f"{self.path.name}: table {table} unreadable ({damage(MemoryError())}); none of its rows kept")
            return [], []
        except sqlite3.DatabaseError as exc:
            if is_interrupt(exc):  # a deadline is no damage that reading block by block would get around
                self._note(f"{self.path.name}: table {table} unreadable ({damage(exc)}); none of its rows kept")
                return [], []
            rows = self._salvage(table, sql_cols, where, params, after_rowid, exc)
        return cols, rows

    def _note_trimmed(self, table: str, df: pd.DataFrame) -> None:
        """Name the text cells cut to :data:`gpudash.store.bounded.TEXT_CHARS` while reading."""
        for col, n in count_trimmed(df).items():
            self._note(f"{self.path.name}: {n:,} {table}.{col[:40]} value(s) longer than "
                       f"{bounded.TEXT_CHARS:,} characters; trimmed")

    def _salvage(self, table: str, sql_cols: str, where: str, params: tuple[Any, ...], after: int,
                 exc: Exception) -> list[tuple[Any, ...]]:
        """Read a damaged table block by block; a failing block is bisected down to
        single rows, so only the damaged rows are lost. Scanning stops after a run
        of empty blocks past the last row found (a truncated file ends there)."""
        extra = f" AND {where}" if where else ""
        sql = f"SELECT {sql_cols} FROM {quote_ident(table)} WHERE rowid > ? AND rowid <= ?{extra} ORDER BY rowid"
        lost = 0
        stop = time.monotonic() + 3 * bounded.QUERY_S

        def block(lo: int, hi: int) -> list[tuple[Any, ...]]:
            nonlocal lost
            if time.monotonic() > stop:
                return []
            try:
                return self.conn.execute(sql, (lo, hi, *params)).fetchall()
            except sqlite3.DatabaseError as err:
                if hi - lo <= 1 or is_interrupt(err):
                    lost += 1
                    return []
                mid = (lo + hi) // 2
                return block(lo, mid) + block(mid, hi)

        top = self.max_rowid(table)
        rows: list[tuple[Any, ...]] = []
        lo, misses = after, 0
        while ((top and lo < top) or (not top and misses < 8)) and time.monotonic() <= stop:
            got = block(lo, lo + _SALVAGE_BLOCK)
            rows += got
            misses = 0 if got else misses + 1
            lo += _SALVAGE_BLOCK
        late = f"; stopped after {3 * bounded.QUERY_S:g} s" if time.monotonic() > stop else ""
        self._note(f"{self.path.name}: table {table} is damaged ({damage(exc)}); kept {len(rows)} rows, "
                   f"about {lost} unreadable{late}")
        return rows

    def read_numeric(self, table: str) -> pd.DataFrame:
        """A whole numeric table, fast: columnar chunks plus the rows written since."""
        cols = self.columns(table)
        if not cols:
            return pd.DataFrame()
        names: list[str] = []
        mat: np.ndarray | None = None
        covered = 0
        if self.has_table(CHUNK_TABLE):
            with bounded.large_values(self.conn):  # a merged chunk of a long run is one large blob
                names, mat, covered = read_chunks(self.conn, table)
        if mat is not None and len(names) > MAX_COLUMNS:
            keep = [i for i, c in enumerate(names) if c in cols]
            names, mat = [names[i] for i in keep], mat[keep]
        tail = self.read(table, after_rowid=covered)
        if mat is None:
            return tail.drop(columns="_rowid") if len(tail) else pd.DataFrame(columns=cols)
        n = mat.shape[1]
        # (columns, rows) transposed is a zero-copy (rows, columns) block for pandas
        head = pd.DataFrame(mat.T, columns=names, copy=False)
        chunk_cols = set(names)
        text_cols = [c for c in cols if c not in chunk_cols]
        if text_cols and covered:
            try:
                rows = self.conn.execute(
                    f"SELECT {', '.join(map(trimmed_column, text_cols))} FROM {quote_ident(table)}"
                    " WHERE rowid <= ? ORDER BY rowid", (covered,)
                ).fetchall()
                if len(rows) == n:
                    text = pd.DataFrame.from_records(rows, columns=text_cols)
                    head = pd.concat([head, text], axis=1)  # one block, not a column at a time
                    self._note_trimmed(table, text)
            except (sqlite3.DatabaseError, MemoryError) as exc:
                self._note(f"{self.path.name}: text columns of {table} unreadable ({damage(exc)})")
        df = pd.concat([head, tail.drop(columns="_rowid")], ignore_index=True) if len(tail) else head
        for c in ("step", "gpu"):
            if c in df and df[c].notna().all():
                df[c] = df[c].astype("int64")
        order = [c for c in cols if c in df.columns]
        return df if list(df.columns) == order else df[order]

    def read_rollup(self, table: str, level: int, t0: float | None, t1: float | None) -> pd.DataFrame:
        name = rollup_table(table, level)
        where, params = time_where(t0, t1, "bucket")
        df = self.read(name, where, params)
        if df.empty:
            return df
        df = df.drop(columns="_rowid").rename(columns={"bucket": "time"}).sort_values("time")
        return df.reset_index(drop=True)

    def count(self, table: str, t0: float | None, t1: float | None) -> int:
        where, params = time_where(t0, t1, "time")
        sql = f"SELECT count(*) FROM {quote_ident(table)}" + (f" WHERE {where}" if where else "")
        rows = self.query(sql, params, tables=(table,))
        return int(rows[0][0] or 0) if rows else 0

    # ---- the questions pages, the API and /metrics ask (no SQL outside the store) ------------
    def bounds(self, table: str, col: str = "time") -> tuple[float, float] | None:
        """Smallest and largest ``col`` of ``table``: two index probes (one query of both scans the table)."""
        q, t = quote_ident(col), quote_ident(table)
        lo = self.query(f"SELECT min({q}) FROM {t}", tables=(table,))
        hi = self.query(f"SELECT max({q}) FROM {t}", tables=(table,))
        return _pair(lo[0][0], hi[0][0]) if lo and hi else None

    def span(self, table: str, col: str, by: str, lo: float | None, hi: float | None) -> tuple[float, float] | None:
        """Smallest and largest ``col`` over the rows whose ``by`` lies in [lo, hi] (None: open)."""
        where, params = time_where(lo, hi, quote_ident(by))
        q = quote_ident(col)
        sql = f"SELECT min({q}), max({q}) FROM {quote_ident(table)}" + (f" WHERE {where}" if where else "")
        rows = self.query(sql, params, tables=(table,))
        return _pair(*rows[0]) if rows else None

    def time_at_step(self, step: int) -> float | None:
        """When the last step at or before ``step`` ended (None: no such step, or a damaged table)."""
        rows = self.query("SELECT time FROM steps WHERE step <= ? ORDER BY step DESC LIMIT 1", (int(step),),
                          tables=("steps",))
        return float(rows[0][0]) if rows and isinstance(rows[0][0], (int, float)) else None

    def rows_near_step(self, table: str, step: int, lookback: int) -> pd.DataFrame:
        """Rows of ``table`` whose step lies in (step - lookback, step]."""
        return self.read(table, "step <= ? AND step > ?", (int(step), int(step) - int(lookback)))

    def last_sample_at(self, table: str, step: int) -> pd.DataFrame:
        """Rows of the last step sampled in ``table`` at or before ``step`` (activations are sampled)."""
        t = quote_ident(table)
        return self.read(table, f"step = (SELECT max(step) FROM {t} WHERE step <= ?)", (int(step),))

    def read_matching(self, table: str, match: dict[str, Any], after_rowid: int = 0) -> pd.DataFrame:
        """:meth:`read` of the rows whose columns equal ``match`` (e.g. one GPU of ``device``)."""
        where = " AND ".join(f"{quote_ident(c)} = ?" for c in match)
        return self.read(table, where, tuple(match.values()), after_rowid=after_rowid)

    def newest_value(self, table: str, col: str, match: dict[str, Any] | None = None) -> Any:
        """The newest non-null ``col`` of ``table`` among rows equal to ``match`` (None: none)."""
        q = quote_ident(col)
        cond = [f"{q} IS NOT NULL", *(f"{quote_ident(c)} = ?" for c in match or {})]
        rows = self.query(f"SELECT {q} FROM {quote_ident(table)} WHERE {' AND '.join(cond)} "
                          "ORDER BY rowid DESC LIMIT 1", tuple((match or {}).values()), tables=(table,))
        return rows[0][0] if rows else None

    def distinct(self, table: str, col: str, limit: int) -> list[Any]:
        """Up to ``limit`` distinct values of ``col``."""
        rows = self.query(f"SELECT DISTINCT {quote_ident(col)} FROM {quote_ident(table)} LIMIT {int(limit)}",
                          tables=(table,))
        return [r[0] for r in rows or ()]

    def count_by(self, table: str, col: str, chars: int, limit: int) -> list[tuple[Any, int]]:
        """(value cut to ``chars`` characters, rows) for up to ``limit`` values of ``col``."""
        rows = self.query(f"SELECT substr({quote_ident(col)}, 1, {int(chars)}), count(*) FROM {quote_ident(table)} "
                          f"GROUP BY 1 LIMIT {int(limit)}", tables=(table,))
        return [(k, int(n)) for k, n in rows or ()]


def time_where(t0: float | None, t1: float | None, col: str) -> tuple[str, tuple[Any, ...]]:
    parts, params = [], []
    if t0 is not None:
        parts.append(f"{col} >= ?")
        params.append(t0)
    if t1 is not None:
        parts.append(f"{col} <= ?")
        params.append(t1)
    return " AND ".join(parts), tuple(params)




def _pair(a: Any, b: Any) -> tuple[float, float] | None:
    return (float(a), float(b)) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def merged_span(spans: Any) -> tuple[float, float] | None:
    """The span covering every rank's (lo, hi); None when no rank had one."""
    got = [s for s in spans if s is not None]
    return (min(s[0] for s in got), max(s[1] for s in got)) if got else None
