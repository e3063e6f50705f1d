"""Read a run directory while it is being written, or long after it crashed.

:class:`RunReader` opens every ``rankN.db`` read-only and never raises on a
damaged file: whatever cannot be read is named in :attr:`RunReader.problems`
and the rest is returned. Live views tail it with :meth:`RunReader.read_since`;
replays ask for a time or step range with :meth:`RunReader.read_range`, which
switches to the 1 s / 60 s roll-ups when the raw range is too long.
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

from gpudash.errors import RunError
from gpudash.store import bounded
from gpudash.store.bounded import count_trimmed, damage, is_interrupt, real_tables, trimmed_column
from gpudash.store.chunks import CHUNK_TABLE, read_chunks
from gpudash.store.meta import clean_meta, read_run_json
from gpudash.store.rankfile import Scratch, log_heartbeat, open_rank_db, wal_path
from gpudash.store.schema import (
    NUMERIC_TABLES,
    ROLLUP_LEVELS,
    RUN_META_FILE,
    TABLE_BASE_COLUMNS,
    quote_ident,
    rank_from_db_name,
    rollup_table,
)

__all__ = ["RankReader", "RunReader", "Cursor", "is_run_dir", "read_run_json"]

#: A writer that has not written a heartbeat for this long (and at least 4
#: flush intervals) is treated as dead: its run reads ``crashed``.
STALE_AFTER_S = 3.0
_SALVAGE_BLOCK = 2048
#: Columns read of one table at most (gpudash's own first); SQLite's own limit is 2,000 per result.
MAX_COLUMNS = 1000
#: Keys read of a rank's meta table at most, and the longest value kept (gpudash writes a few kB).
META_ROWS = 10_000
META_VALUE_CHARS = 1 << 20

Cursor = dict[str, int]  # "rank/table" -> last rowid seen


def is_run_dir(path: Path) -> bool:
    try:
        return (path / RUN_META_FILE).is_file() or any(
            rank_from_db_name(p.name.removesuffix("-wal")) is not None for p in path.iterdir()
        )
    except OSError:
        return False


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


class RankReader:
    """One rank's database."""

    def __init__(self, path: Path) -> None:
        self.path = path
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
        beat = log_heartbeat(self.path)  # newer than the stored heartbeat while the writer lives
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
        meta = self.meta() if meta is None else meta
        status = str(meta.get("status", "crashed"))
        if status != "live":
            return status
        now = time.time() if now is None else now
        stale = max(STALE_AFTER_S, 4 * float(meta.get("flush_interval") or 0.5),
                    3 * float(meta.get("publish_interval") or 0.0))  # published copies lag by up to one interval
        if now - float(meta.get("heartbeat") or 0) > stale:
            return "crashed"
        pid = meta.get("pid")
        if meta.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
            return "crashed"
        return "live"

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
        df = pd.DataFrame.from_records(rows, columns=["_rowid", *cols])
        self._note_trimmed(table, df)
        return df

    def read_rows(self, table: str, where: str = "", params: tuple[Any, ...] = (), after_rowid: int = 0,
                  limit: int | None = None) -> tuple[list[str], list[tuple[Any, ...]]]:
        """:meth:`read` as (column names, row tuples whose first item is the rowid), no DataFrame: for a
        watcher that looks often at few new rows (gpudash.alert_watch)."""
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
            return tail.drop(columns="_rowid")
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
        where, params = _time_where(t0, t1, "bucket")
        df = self.read(name, where, params)
        if df.empty:
            return df
        df = df.drop(columns="_rowid").rename(columns={"bucket": "time"}).sort_values("time")
        return df.reset_index(drop=True)

    def count(self, table: str, t0: float | None, t1: float | None) -> int:
        where, params = _time_where(t0, t1, "time")
        sql = f"SELECT count(*) FROM {quote_ident(table)}" + (f" WHERE {where}" if where else "")
        rows = self.query(sql, params, tables=(table,))
        return int(rows[0][0] or 0) if rows else 0


def _time_where(t0: float | None, t1: float | None, col: str) -> tuple[str, tuple[Any, ...]]:
    parts, params = [], []
    if t0 is not None:
        parts.append(f"{col} >= ?")
        params.append(t0)
    if t1 is not None:
        parts.append(f"{col} <= ?")
        params.append(t1)
    return " AND ".join(parts), tuple(params)


class RunReader:
    """All ranks of one run directory."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir)
        if not self.path.exists():
            raise RunError(f"{self.path}: no such run directory (check the path; runs are folders)")
        if not self.path.is_dir():
            raise RunError(f"{self.path}: not a directory (pass the run folder, not a file in it)")
        self.problems: list[str] = []
        self.ranks: dict[int, RankReader] = {}
        self.refresh()
        if not self.ranks and not self.problems and not (self.path / RUN_META_FILE).exists():
            raise RunError(f"{self.path}: not a gpudash run (no rank*.db or run.json inside)")

    def refresh(self) -> None:
        """Pick up ranks that started writing since the reader opened."""
        found = {p.name.removesuffix("-wal") for p in self.path.glob("rank*.db-wal")}
        found.update(p.name for p in self.path.glob("rank*.db"))
        for db in sorted(self.path / n for n in found):
            rank = rank_from_db_name(db.name)
            if rank is None or rank in self.ranks:
                continue
            try:
                self.ranks[rank] = RankReader(db)
            except (sqlite3.DatabaseError, OSError, MemoryError) as exc:
                msg = f"{db.name}: unreadable ({damage(exc)}); that rank's records are lost, other ranks shown"
                if msg not in self.problems:
                    self.problems.append(msg)
        for r in self.ranks.values():
            r.refresh_columns()

    def close(self) -> None:
        for r in self.ranks.values():
            r.close()

    def all_problems(self) -> list[str]:
        out = list(self.problems)
        for r in self.ranks.values():
            out += [p for p in r.problems if p not in out]
        return out

    def run_meta(self) -> dict[str, Any]:
        return read_run_json(self.path, self.problems)

    def rank_meta(self) -> dict[int, dict[str, Any]]:
        return {rank: r.meta() for rank, r in sorted(self.ranks.items())}

    def status(self) -> str:
        """``live`` if any rank is live, else ``crashed`` if any crashed, else ``finished``."""
        if not self.ranks:
            return "crashed"
        states = [r.status() for r in self.ranks.values()]
        for s in ("live", "crashed"):
            if s in states:
                return s
        return "finished"

    # ---- whole tables -----------------------------------------------------------------
    def read_table(self, table: str) -> pd.DataFrame:
        frames = []
        for rank, r in sorted(self.ranks.items()):
            if table in NUMERIC_TABLES:
                df = r.read_numeric(table)
            else:
                if table == "snapshots":  # compressed summaries: blobs larger than any other cell
                    with bounded.large_values(r.conn):
                        df = r.read(table)
                else:
                    df = r.read(table)
                if "_rowid" in df:
                    df = df.drop(columns="_rowid")
            if len(df):
                df.insert(0, "rank", rank)
                frames.append(df)
        if not frames:
            cols = ["rank", *(c for c, _ in TABLE_BASE_COLUMNS.get(table, ()))]
            return pd.DataFrame(columns=cols)
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)

    # ---- live tailing -----------------------------------------------------------------
    def read_since(self, cursor: Cursor | None = None, tables: tuple[str, ...] = NUMERIC_TABLES + ("events",),
                   limit: int | None = 50_000) -> tuple[dict[str, pd.DataFrame], Cursor]:
        """New rows per table since ``cursor`` (a dict you pass back next time)."""
        self.refresh()
        cursor = dict(cursor or {})
        out: dict[str, pd.DataFrame] = {}
        for table in tables:
            frames = []
            for rank, r in sorted(self.ranks.items()):
                key = f"{rank}/{table}"
                df = r.read(table, after_rowid=cursor.get(key, 0), limit=limit)
                if len(df):
                    cursor[key] = int(df["_rowid"].iloc[-1])
                    df = df.drop(columns="_rowid")
                    df.insert(0, "rank", rank)
                    frames.append(df)
            if frames:
                out[table] = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return out, cursor

    # ---- replay ranges ----------------------------------------------------------------
    def time_bounds(self, table: str = "steps") -> tuple[float, float] | None:
        lo, hi = np.inf, -np.inf
        for r in self.ranks.values():
            # two queries: each is one index probe, together they would scan the table
            lo_rows = r.query(f"SELECT min(time) FROM {quote_ident(table)}", tables=(table,))
            hi_rows = r.query(f"SELECT max(time) FROM {quote_ident(table)}", tables=(table,))
            if not lo_rows or not hi_rows:
                continue
            a, b = lo_rows[0][0], hi_rows[0][0]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                lo, hi = min(lo, a), max(hi, b)
        return None if lo == np.inf else (float(lo), float(hi))

    def step_times(self, step0: int | None, step1: int | None) -> tuple[float | None, float | None]:
        """The time span of a step range (over all ranks), for range queries by step."""
        lo, hi = np.inf, -np.inf
        where, params = [], []
        if step0 is not None:
            where.append("step >= ?")
            params.append(step0)
        if step1 is not None:
            where.append("step <= ?")
            params.append(step1)
        sql = "SELECT min(time), max(time) FROM steps" + (f" WHERE {' AND '.join(where)}" if where else "")
        for r in self.ranks.values():
            rows = r.query(sql, params, tables=("steps",))
            if not rows:
                continue
            a, b = rows[0]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                lo, hi = min(lo, a), max(hi, b)
        if lo == np.inf:
            return None, None
        # a step's time is when it ended: start the range at the previous step's end
        return (float(lo) - 1e-9 if step0 is not None else None), (float(hi) if step1 is not None else None)

    def read_range(self, table: str, t0: float | None = None, t1: float | None = None,
                   max_rows: int = 5_000, *, step0: int | None = None,
                   step1: int | None = None) -> tuple[pd.DataFrame, int]:
        """Rows of a numeric table between two times (or steps): raw if few enough, else a roll-up.

        Returns ``(frame, level)`` where level 0 means raw rows and otherwise the
        bucket width in seconds (the frame then has ``c``, ``c__min``, ``c__max``).
        """
        if step0 is not None or step1 is not None:
            s0, s1 = self.step_times(step0, step1)
            t0 = s0 if s0 is not None else t0
            t1 = s1 if s1 is not None else t1
        total = sum(r.count(table, t0, t1) for r in self.ranks.values())
        if total <= max_rows or table not in NUMERIC_TABLES:
            where, params = _time_where(t0, t1, "time")
            return self._concat(table, lambda r: r.read(table, where, params)), 0
        level = ROLLUP_LEVELS[-1]
        span = None
        if t0 is None or t1 is None:
            bounds = self.time_bounds(table)
            if bounds:
                span = (t1 if t1 is not None else bounds[1]) - (t0 if t0 is not None else bounds[0])
        else:
            span = t1 - t0
        for lv in ROLLUP_LEVELS:
            if span is not None and span / lv <= max_rows:
                level = lv
                break
        return self._concat(table, lambda r: r.read_rollup(table, level, t0, t1)), level

    def _concat(self, table: str, fn: Any) -> pd.DataFrame:
        frames = []
        for rank, r in sorted(self.ranks.items()):
            df = fn(r)
            if len(df):
                if "_rowid" in df:
                    df = df.drop(columns="_rowid")
                df.insert(0, "rank", rank)
                frames.append(df)
        if not frames:
            return pd.DataFrame()
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
