"""Read a run directory while it is being written, or long after it crashed.

:class:`RunReader` opens every ``rankN.db`` read-only and never raises on a
damaged file: whatever cannot be read is named in :attr:`RunReader.problems`
and the rest is returned. Live views tail it with :meth:`RunReader.read_since`;
replays ask for a time or step range with :meth:`RunReader.read_range`, which
switches to the 1 s / 60 s roll-ups when the raw range is too long.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd

from gpudash.errors import RunError
from gpudash.store import bounded
from gpudash.store.attempts import ATTEMPT_COLUMN, PER_STEP_TABLES, supersede, with_attempts
from gpudash.store.bounded import damage
from gpudash.store.listed import materialize
from gpudash.store.meta import read_run_json
from gpudash.store.mirror import SegmentMirror, origin_of, segment_mirror, unpublished_note
from gpudash.store.objstore import RUN_META_BYTES, Store, is_url, open_store, run_name
from gpudash.store.rankreader import RankReader, merged_span, time_where
from gpudash.store.schema import (
    NUMERIC_TABLES,
    ROLLUP_LEVELS,
    ROLLUP_TABLES,
    RUN_META_FILE,
    TABLE_BASE_COLUMNS,
    rank_from_db_name,
)
from gpudash.store.segments import SEGMENTS_DIR

__all__ = ["Cursor", "RankReader", "RunReader", "is_run_dir", "read_run_json"]

Cursor = dict[str, int]  # "rank/table" -> last rowid seen


def is_run_dir(path: Path) -> bool:
    try:
        return (path / RUN_META_FILE).is_file() or (path / SEGMENTS_DIR).is_dir() or any(
            rank_from_db_name(p.name.removesuffix("-wal")) is not None for p in path.iterdir()
        )
    except OSError:
        return False


class RunReader:
    """All ranks of one run: a run directory (rank files, or segments published into it from other nodes:
    :mod:`gpudash.store.segments`), or an object-store URL (``s3://bucket/runs/exp1``) holding segments."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.problems: list[str] = []
        #: which rows of a resumed run :meth:`read_table` gives by default: ``"latest"`` or ``"all"``
        self.attempts = "latest"
        self.ranks: dict[int, RankReader] = {}
        self.url = str(run_dir).rstrip("/") if is_url(run_dir) else None
        self._mirror: SegmentMirror | None = None
        self._shared_mirror = False  # a run's segment cache shared by its readers (gpudash.store.runsync)
        if self.url is not None:
            self._open_url(self.url)
        else:
            self.path = Path(run_dir)
            materialize(self.path)  # a run listed from an object store gets its folder as it is opened
            if not self.path.exists():
                raise RunError(f"{self.path}: no such run directory (check the path; runs are folders)")
            if not self.path.is_dir():
                raise RunError(f"{self.path}: not a directory (pass the run folder, not a file in it)")
        self.refresh()
        if not self.ranks and not self.problems and not (self.path / RUN_META_FILE).exists():
            raise RunError(f"{self.url or self.path}: not a gpudash run (no rank*.db, segments/ or run.json inside)")

    def _open_url(self, url: str) -> None:
        """A run in an object store: its segments mirrored into a private folder named like the run, which
        also holds a copy of its ``run.json``; :attr:`path` is that folder."""
        store = open_store(url)
        self._mirror = SegmentMirror(store, self._problem)
        self.path = self._mirror.folder / run_name(url)
        self.path.mkdir()
        try:
            found = store.exists(RUN_META_FILE) or bool(store.find(SEGMENTS_DIR))
        except Exception as exc:  # noqa: BLE001 - whatever the driver raises: one line
            self._mirror.close()
            raise RunError(f"{url}: cannot read the store ({type(exc).__name__}: {str(exc)[:200]}); check the "
                           "URL, the credentials (AWS_*) and the endpoint (AWS_ENDPOINT_URL)") from None
        if not found:
            self._mirror.close()
            raise RunError(f"{url}: not a gpudash run (no run.json or segments/ there)")
        self._fetch_run_json(store)

    def _fetch_run_json(self, store: Store) -> None:
        if (self.path / RUN_META_FILE).exists():
            return
        try:
            (self.path / RUN_META_FILE).write_bytes(store.get(RUN_META_FILE, limit=RUN_META_BYTES))
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 - noted; the ranks are still read
            self._problem(f"{RUN_META_FILE}: unreadable ({type(exc).__name__}: {str(exc)[:200]})")

    def _problem(self, msg: str) -> None:
        if msg not in self.problems:
            self.problems.append(msg)

    def refresh(self) -> None:
        """Pick up ranks that started writing since the reader opened (and segments published since)."""
        found = {p.name.removesuffix("-wal") for p in self.path.glob("rank*.db-wal")}
        found.update(p.name for p in self.path.glob("rank*.db"))
        for db in sorted(self.path / n for n in found):
            rank = rank_from_db_name(db.name)
            if rank is None or rank in self.ranks:
                continue
            self._open_rank(rank, db)
        if self._shared_mirror and self._mirror is not None and self._mirror.closed:
            # its segments were dropped from the local cache (bounded): the ranks read from them are opened
            # again from a fresh fetch
            for rank in [k for k, r in self.ranks.items() if not r.live_log]:
                self.ranks.pop(rank).close()
            self._mirror, self._shared_mirror = None, False
        if self._mirror is None and self.url is None:
            origin = origin_of(self.path)
            if origin is not None:  # listed from an object store: its segments are fetched now, on opening
                self._mirror = segment_mirror(origin, self._problem)
                self._shared_mirror = True
            elif (self.path / SEGMENTS_DIR).is_dir():
                self._mirror = SegmentMirror(open_store(self.path), self._problem)
        if self._mirror is not None:
            if self.url is not None:
                self._fetch_run_json(self._mirror.store)
            for rank, db in sorted(self._mirror.sync().items()):
                if rank not in self.ranks:  # a rank file beside its segments (an older whole copy) is read first
                    self._open_rank(rank, db, published=True)
        for r in self.ranks.values():
            r.refresh_columns()

    def _open_rank(self, rank: int, db: Path, published: bool = False) -> None:
        try:
            self.ranks[rank] = RankReader(db, live_log=not published)
        except (sqlite3.DatabaseError, OSError, MemoryError) as exc:
            self._problem(f"{db.name}: unreadable ({damage(exc)}); that rank's records are lost, other ranks shown")

    def close(self) -> None:
        for r in self.ranks.values():
            r.close()
        if self._mirror is not None and not self._shared_mirror:
            self._mirror.close()

    def all_problems(self) -> list[str]:
        out = list(self.problems)
        for r in self.ranks.values():
            out += [p for p in r.problems if p not in out]
            if not r.live_log:  # published: name what a crashed rank did not publish
                meta = r.meta()
                if r.status(meta) == "crashed":
                    out.append(unpublished_note(r.rank, meta))
        return out

    def run_meta(self) -> dict[str, Any]:
        return read_run_json(self.path, self.problems)

    def rank_meta(self) -> dict[int, dict[str, Any]]:
        if self._mirror is not None:  # published segments: the newest meta (at most one listing a second)
            self.refresh()
        return {rank: r.meta() for rank, r in sorted(self.ranks.items())}

    def status(self) -> str:
        """``live`` if any rank is live, else ``crashed`` if any crashed, else ``finished``."""
        if self._mirror is not None:
            self.refresh()
        if not self.ranks:
            return "crashed"
        states = [r.status() for r in self.ranks.values()]
        for s in ("live", "crashed"):
            if s in states:
                return s
        return "finished"

    # ---- whole tables -----------------------------------------------------------------
    def attempt_starts(self) -> dict[tuple[int, int], int]:
        """``{(rank, attempt): the first step it recorded}`` for every attempt after the first
        (:mod:`gpudash.store.attempts`); ``{}`` for a run no process resumed."""
        out: dict[tuple[int, int], int] = {}
        for rank, r in sorted(self.ranks.items()):
            if rank not in self._resumed_ranks():
                continue
            rows = r.query(f"SELECT {ATTEMPT_COLUMN}, min(step) FROM steps WHERE {ATTEMPT_COLUMN} > 1 "
                           f"GROUP BY {ATTEMPT_COLUMN}", tables=("steps",)) or []
            out.update({(rank, int(a)): int(s) for a, s in rows
                        if isinstance(a, (int, float)) and isinstance(s, (int, float))})
        return out

    def _resumed_ranks(self) -> set[int]:
        """Ranks a later attempt recorded into (their meta says so: a column named ``attempt`` alone, in a run
        an older version recorded or anyone wrote, is a logged value, not attempts)."""
        out = set()
        for rank, r in self.ranks.items():
            if ATTEMPT_COLUMN not in r.columns("steps"):
                continue
            a = r.meta().get(ATTEMPT_COLUMN)
            if isinstance(a, int) and not isinstance(a, bool) and a > 1:
                out.add(rank)
        return out

    def _attempts(self, table: str, df: pd.DataFrame, attempts: str) -> pd.DataFrame:
        """Rows of every attempt (``"all"``, with an ``attempt`` column), or each step once, from the attempt
        that recorded it last (``"latest"``, the default view: :func:`gpudash.store.attempts.supersede`)."""
        if attempts == "all":
            return with_attempts(df)
        if attempts != "latest":
            raise ValueError(f"attempts={attempts!r}: pass 'latest' (each step once) or 'all' (every attempt's rows)")
        if ATTEMPT_COLUMN not in df or not self._resumed_ranks():
            return df
        df = with_attempts(df)
        return supersede(df, self.attempt_starts()) if table in PER_STEP_TABLES else df

    def read_table(self, table: str, attempts: str | None = None) -> pd.DataFrame:
        """One table of every rank (with a ``rank`` column); ``attempts``: see :meth:`_attempts` (default:
        :attr:`attempts`)."""
        return self._attempts(table, self._read_table(table), attempts or self.attempts)

    def _read_table(self, table: str) -> pd.DataFrame:
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
                if "_rowid" in df and len(df):
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
        """First and last time in ``table`` over all ranks."""
        return merged_span(r.bounds(table) for r in self.ranks.values())

    def step_span(self, t0: float | None, t1: float | None) -> tuple[float, float] | None:
        """First and last step that ended between ``t0`` and ``t1`` (seconds since the epoch), over all ranks."""
        return merged_span(r.span("steps", "step", "time", t0, t1) for r in self.ranks.values())

    def time_span(self, step0: float | None, step1: float | None) -> tuple[float, float] | None:
        """When the steps ``step0``..``step1`` ended, first and last, over all ranks."""
        return merged_span(r.span("steps", "time", "step", step0, step1) for r in self.ranks.values())

    def step_times(self, step0: int | None, step1: int | None) -> tuple[float | None, float | None]:
        """The time span of a step range (over all ranks), for range queries by step."""
        span = self.time_span(step0, step1)
        if span is None:
            return None, None
        # a step's time is when it ended: start the range at the previous step's end
        return (span[0] - 1e-9 if step0 is not None else None), (span[1] if step1 is not None else None)

    def read_range(self, table: str, t0: float | None = None, t1: float | None = None,
                   max_rows: int = 5_000, *, step0: int | None = None,
                   step1: int | None = None) -> tuple[pd.DataFrame, int]:
        """Rows of a numeric table between two times (or steps): raw if few enough (always, for the step tables,
        which are not rolled up: see ROLLUP_TABLES), else a roll-up.

        Returns ``(frame, level)`` where level 0 means raw rows and otherwise the
        bucket width in seconds (the frame then has ``c``, ``c__min``, ``c__max``).
        """
        if step0 is not None or step1 is not None:
            s0, s1 = self.step_times(step0, step1)
            t0 = s0 if s0 is not None else t0
            t1 = s1 if s1 is not None else t1
        total = sum(r.count(table, t0, t1) for r in self.ranks.values())
        if total <= max_rows or table not in ROLLUP_TABLES:  # a step table: its rows (callers downsample)
            where, params = time_where(t0, t1, "time")
            return self._attempts(table, self._concat(table, lambda r: r.read(table, where, params)), "latest"), 0
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
