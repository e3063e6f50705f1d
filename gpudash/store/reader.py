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
from gpudash.store.chunks import read_chunks
from gpudash.store.meta import clean_meta
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

__all__ = ["RankReader", "RunReader", "Cursor", "is_run_dir"]

#: A writer that has not written a heartbeat for this long (and at least 4
#: flush intervals) is treated as dead: its run reads ``crashed``.
STALE_AFTER_S = 3.0
_SALVAGE_BLOCK = 2048

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
        try:
            for key, value in self.conn.execute("SELECT key, value FROM meta"):
                if not isinstance(key, str):
                    continue
                try:
                    out[key] = json.loads(value)
                except (TypeError, ValueError, RecursionError):
                    out[key] = value
        except sqlite3.DatabaseError as exc:
            self._note(f"{self.path.name}: meta table unreadable ({exc})")
        meta = clean_meta(out, f"{self.path.name} meta", self.problems)
        beat = log_heartbeat(self.path)  # newer than the stored heartbeat while the writer lives
        if beat is not None and beat > float(meta.get("heartbeat") or 0):
            meta["heartbeat"] = min(beat, time.time())  # a log stamped in the future is not a writer seen then
        return meta

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
    def columns(self, table: str) -> list[str]:
        cols = self._columns.get(table)
        if cols is None:
            try:
                cols = [r[1] for r in self.conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
            except sqlite3.DatabaseError as exc:
                self._note(f"{self.path.name}: table {table} unreadable ({exc})")
                cols = []
            if cols:
                self._columns[table] = cols
        return cols

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

    def max_rowid(self, table: str) -> int:
        """Largest rowid, or 0 when unknown (empty or damaged)."""
        try:
            return int(self.conn.execute(f"SELECT max(rowid) FROM {quote_ident(table)}").fetchone()[0] or 0)
        except sqlite3.DatabaseError:
            return 0

    def read(self, table: str, where: str = "", params: tuple[Any, ...] = (), after_rowid: int = 0,
             limit: int | None = None) -> pd.DataFrame:
        """Rows of ``table`` (with a ``_rowid`` column) matching ``where``; salvages damaged tables."""
        cols = self.columns(table)
        if not cols:
            return pd.DataFrame()
        cond = ["rowid > ?"] + ([where] if where else [])
        sql_cols = ", ".join(["rowid", *map(quote_ident, cols)])
        sql = f'SELECT {sql_cols} FROM {quote_ident(table)} WHERE {" AND ".join(cond)} ORDER BY rowid'
        if limit:
            sql += f" LIMIT {int(limit)}"
        try:
            rows = self.conn.execute(sql, (after_rowid, *params)).fetchall()
        except sqlite3.DatabaseError as exc:
            rows = self._salvage(table, sql_cols, where, params, after_rowid, exc)
        return pd.DataFrame.from_records(rows, columns=["_rowid", *cols])

    def _salvage(self, table: str, sql_cols: str, where: str, params: tuple[Any, ...], after: int,
                 exc: Exception) -> list[tuple[Any, ...]]:
        """Read a damaged table block by block; a failing block is bisected down to
        single rows, so only the damaged rows are lost. Scanning stops after a run
        of empty blocks past the last row found (a truncated file ends there)."""
        extra = f" AND {where}" if where else ""
        sql = f"SELECT {sql_cols} FROM {quote_ident(table)} WHERE rowid > ? AND rowid <= ?{extra} ORDER BY rowid"
        lost = 0

        def block(lo: int, hi: int) -> list[tuple[Any, ...]]:
            nonlocal lost
            try:
                return self.conn.execute(sql, (lo, hi, *params)).fetchall()
            except sqlite3.DatabaseError:
                if hi - lo <= 1:
                    lost += 1
                    return []
                mid = (lo + hi) // 2
                return block(lo, mid) + block(mid, hi)

        top = self.max_rowid(table)
        rows: list[tuple[Any, ...]] = []
        lo, misses = after, 0
        while (top and lo < top) or (not top and misses < 8):
            got = block(lo, lo + _SALVAGE_BLOCK)
            rows += got
            misses = 0 if got else misses + 1
            lo += _SALVAGE_BLOCK
        self._note(f"{self.path.name}: table {table} is damaged ({exc}); kept {len(rows)} rows, "
                   f"about {lost} unreadable")
        return rows

    def read_numeric(self, table: str) -> pd.DataFrame:
        """A whole numeric table, fast: columnar chunks plus the rows written since."""
        cols = self.columns(table)
        if not cols:
            return pd.DataFrame()
        names, mat, covered = read_chunks(self.conn, table)
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
                    f"SELECT {', '.join(map(quote_ident, text_cols))} FROM {quote_ident(table)}"
                    " WHERE rowid <= ? ORDER BY rowid", (covered,)
                ).fetchall()
                if len(rows) == n:
                    for i, c in enumerate(text_cols):
                        head[c] = [r[i] for r in rows]
            except sqlite3.DatabaseError as exc:
                self._note(f"{self.path.name}: text columns of {table} unreadable ({exc})")
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
        try:
            sql = f"SELECT count(*) FROM {quote_ident(table)}" + (f" WHERE {where}" if where else "")
            return int(self.conn.execute(sql, params).fetchone()[0])
        except sqlite3.DatabaseError:
            return 0


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
            except sqlite3.DatabaseError as exc:
                msg = f"{db.name}: unreadable ({exc}); that rank's records are lost, other ranks shown"
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
        path = self.path / RUN_META_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:
            msg = f"{RUN_META_FILE}: unreadable ({type(exc).__name__}: {str(exc)[:200]}); using the per-rank meta"
            if msg not in self.problems:
                self.problems.append(msg)
            return {}
        if not isinstance(data, dict):
            msg = f"{RUN_META_FILE}: holds a {type(data).__name__}, not a JSON object; using the per-rank meta"
            if msg not in self.problems:
                self.problems.append(msg)
            return {}
        return clean_meta(data, RUN_META_FILE, self.problems)

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
            try:  # two queries: each is one index probe, together they would scan the table
                a = r.conn.execute(f"SELECT min(time) FROM {quote_ident(table)}").fetchone()[0]
                b = r.conn.execute(f"SELECT max(time) FROM {quote_ident(table)}").fetchone()[0]
            except sqlite3.DatabaseError:
                continue
            if a is not None:
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
            try:
                a, b = r.conn.execute(sql, params).fetchone()
            except sqlite3.DatabaseError:
                continue
            if a is not None:
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
