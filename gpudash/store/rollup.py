"""Time roll-ups kept by the writer so a week-long run opens like a short one.

For each numeric table ``T`` and bucket width ``L`` (seconds) the table
``T_rL`` holds one row per bucket (and per key, e.g. per GPU): ``bucket``
(start, unix seconds), ``n`` (records) and for every numeric column ``c`` its
mean ``c``, minimum ``c__min`` and maximum ``c__max``. Min and max survive so a
short memory peak is still visible at the coarsest level.

The writer feeds each flushed batch through :meth:`Rollups.update`, which only
adds it to running sums in memory; :meth:`Rollups.write` stores the buckets
that changed since the last write, every few seconds and at close (a roll-up
row rewritten at every 0.5 s flush cost two pages per table and level in the
write-ahead log). Running sums for recent buckets live in memory (bounded);
older buckets are re-aggregated from the raw table when a late record touches
them.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import numpy as np

from gpudash.store.columns import add_columns, column_room, table_columns
from gpudash.store.schema import ROLLUP_KEYS, ROLLUP_LEVELS, quote_ident, rollup_table

__all__ = ["Rollups"]

# (table, level, bucket, *keys) -> {column: [sum, count, min, max]}, plus "__n__"
_Acc = dict[str, list[float]]
_SUFFIXES = ("", "__min", "__max")


class Rollups:
    def __init__(self, conn: sqlite3.Connection, keep_buckets: int = 4) -> None:
        self._conn = conn
        self._keep = keep_buckets
        self._acc: dict[tuple[Any, ...], _Acc] = {}
        self._cols: dict[str, set[str]] = {}
        self._latest: dict[tuple[str, int], float] = {}
        # columns a roll-up table has no room for (SQLite's column limit: 3 roll-up columns per column)
        self._skip: dict[str, set[str]] = {}
        # buckets changed since the last write, and each table's numeric columns seen since then
        self._dirty: set[tuple[Any, ...]] = set()
        self._seen: dict[str, list[str]] = {}
        # running sums as they were before the open transaction, for rollback(): only the touched ones
        self._undo: dict[tuple[Any, ...], _Acc | None] = {}
        self._undo_state: tuple[dict[tuple[str, int], float], set[tuple[Any, ...]], dict[str, list[str]]] = (
            {}, set(), {})

    def begin(self) -> None:
        """Start a transaction: forget the undo log of the last one."""
        self._undo.clear()
        self._undo_state = (dict(self._latest), set(self._dirty), {t: list(c) for t, c in self._seen.items()})

    def rollback(self) -> None:
        """The transaction was rolled back: restore the running sums and re-read the tables' columns."""
        for akey, saved in self._undo.items():
            if saved is None:
                self._acc.pop(akey, None)
            else:
                self._acc[akey] = saved
        self._undo.clear()
        latest, dirty, seen = self._undo_state
        self._latest, self._dirty, self._seen = dict(latest), set(dirty), {t: list(c) for t, c in seen.items()}
        self._cols.clear()

    @property
    def pending(self) -> bool:
        """Whether some bucket changed since the last :meth:`write`."""
        return bool(self._dirty)

    def _touch(self, akey: tuple[Any, ...]) -> None:
        if akey not in self._undo:
            acc = self._acc.get(akey)
            self._undo[akey] = None if acc is None else {c: v[:] for c, v in acc.items()}

    def _ensure_table(self, table: str, level: int, cols: list[str]) -> str:
        name = rollup_table(table, level)
        known = self._cols.get(name)
        keys = ROLLUP_KEYS.get(table, ())
        if known is None:
            key_cols = "".join(f", {quote_ident(k)} INTEGER" for k in keys)
            self._conn.execute(f"CREATE TABLE IF NOT EXISTS {quote_ident(name)} (bucket REAL{key_cols}, n INTEGER)")
            uniq = ", ".join(("bucket", *map(quote_ident, keys)))
            self._conn.execute(
                f"CREATE UNIQUE INDEX IF NOT EXISTS {quote_ident(name + '_key')} ON {quote_ident(name)}({uniq})"
            )
            known = set(table_columns(self._conn, name))
            self._cols[name] = known
        skip = self._skip.setdefault(name, set())
        defs: list[tuple[str, str]] = []
        room = -1
        seen: set[str] = set()
        for c in cols:
            if c in keys or c == "time" or c in skip or c in seen:
                continue
            seen.add(c)
            add = [(c + suffix, "REAL") for suffix in _SUFFIXES if c + suffix not in known]
            if not add:
                continue
            if room < 0:
                room = column_room(self._conn, len(known))
            if len(defs) + len(add) > room:
                skip.add(c)  # SQLite's column limit: the raw rows keep it, only its roll-up is missing
                continue
            defs += add
        refused = add_columns(self._conn, name, defs)  # all at once: one schema change, not 3 per column
        for col in refused:
            skip.add(col.removesuffix("__min").removesuffix("__max"))
        known.update(c for c, _ in defs if c not in refused)
        return name

    def update(self, table: str, numeric: list[str], arr: np.ndarray) -> None:
        """Fold a batch (rows x ``numeric`` columns, float64) into the running sums (see :meth:`write`)."""
        if "time" not in numeric or not len(arr):
            return
        keys = ROLLUP_KEYS.get(table, ())
        seen = self._seen.setdefault(table, [])
        seen += [c for c in numeric if c not in seen]
        t = arr[:, numeric.index("time")]
        key_arr = [arr[:, numeric.index(k)] if k in numeric else np.zeros(len(arr)) for k in keys]
        value_cols = [c for c in numeric if c != "time" and c not in keys]
        values = arr[:, [numeric.index(c) for c in value_cols]] if value_cols else np.empty((len(arr), 0))
        ok = ~np.isnan(t)
        for level in ROLLUP_LEVELS:
            bucket = np.floor(t / level) * level
            group = np.column_stack([bucket, *key_arr])[ok]
            if not len(group):
                continue
            uniq, inv = np.unique(group, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            order = np.argsort(inv, kind="stable")
            starts = np.searchsorted(inv[order], np.arange(len(uniq)))
            vals = values[ok][order]
            valid = ~np.isnan(vals)
            n = np.diff(np.append(starts, len(vals)))
            if vals.shape[1]:
                sums = np.add.reduceat(np.where(valid, vals, 0.0), starts, axis=0)
                cnts = np.add.reduceat(valid.astype(float), starts, axis=0)
                mins = np.fmin.reduceat(vals, starts, axis=0)  # fmin/fmax skip NaN
                maxs = np.fmax.reduceat(vals, starts, axis=0)
            else:
                sums = cnts = mins = maxs = np.zeros((len(uniq), 0))
            for g, key in enumerate(map(tuple, uniq)):
                self._merge(table, level, key, int(n[g]), value_cols, sums[g], cnts[g], mins[g], maxs[g])

    def write(self) -> None:
        """Store every bucket changed since the last write (inside the caller's transaction), then
        let go of the running sums of buckets too old to change."""
        if not self._dirty:
            return
        by_name: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        for akey in self._dirty:
            by_name.setdefault((akey[0], akey[1]), []).append(akey)
        for (table, level), akeys in sorted(by_name.items()):
            keys = ROLLUP_KEYS.get(table, ())
            name = self._ensure_table(table, level, self._seen.get(table, []))
            skip = self._skip.get(name, ())
            all_cols = sorted(c for c in self._cols[name] if c not in ("bucket", "n", *keys)
                              and not c.endswith(("__min", "__max")) and c not in skip)
            rows = [_row(akey[2:], self._acc[akey], all_cols) for akey in sorted(akeys) if akey in self._acc]
            self._upsert(name, keys, all_cols, rows)
            self._evict(table, level, max(akey[2] for akey in akeys))
        self._dirty.clear()
        self._seen.clear()

    def _merge(self, table: str, level: int, key: tuple[float, ...], n: int, cols: list[str],
               sums: np.ndarray, cnts: np.ndarray, mins: np.ndarray, maxs: np.ndarray) -> _Acc | None:
        akey = (table, level, *key)
        self._touch(akey)
        acc = self._acc.get(akey)
        if acc is None:
            acc = {"__n__": [0.0, 0.0, 0.0, 0.0]}
            latest = self._latest.get((table, level))
            if latest is not None and key[0] < latest - self._keep * level:
                # a late record for a bucket already written and let go: re-aggregate it from raw rows
                self._ensure_table(table, level, self._seen.get(table, []))
                self._reaggregate(table, level, key)
                return None
            self._acc[akey] = acc
        self._dirty.add(akey)
        acc["__n__"][0] += n
        for j, c in enumerate(cols):
            cur = acc.get(c)
            if not cnts[j]:
                continue
            if cur is None:
                acc[c] = [float(sums[j]), float(cnts[j]), float(mins[j]), float(maxs[j])]
            else:
                cur[0] += float(sums[j])
                cur[1] += float(cnts[j])
                cur[2] = min(cur[2], float(mins[j]))
                cur[3] = max(cur[3], float(maxs[j]))
        return acc

    def _evict(self, table: str, level: int, newest: float) -> None:
        latest = max(newest, self._latest.get((table, level), newest))
        self._latest[(table, level)] = latest
        horizon = latest - self._keep * level
        for akey in [k for k in self._acc if k[0] == table and k[1] == level and k[2] < horizon]:
            self._touch(akey)
            del self._acc[akey]

    def _upsert(self, name: str, keys: tuple[str, ...], cols: list[str], rows: list[list[Any]]) -> None:
        if not rows:
            return
        names = ["bucket", *keys, "n"]
        for c in cols:
            names += [c, f"{c}__min", f"{c}__max"]
        quoted = ", ".join(map(quote_ident, names))
        marks = ", ".join("?" * len(names))
        self._conn.executemany(f"INSERT OR REPLACE INTO {quote_ident(name)} ({quoted}) VALUES ({marks})", rows)

    def _reaggregate(self, table: str, level: int, key: tuple[float, ...]) -> None:
        name = rollup_table(table, level)
        keys = ROLLUP_KEYS.get(table, ())
        cols = [c for c in self._cols[name] if c not in ("bucket", "n", *keys)
                and not c.endswith(("__min", "__max")) and c not in self._skip.get(name, ())]
        where = "time >= ? AND time < ?" + "".join(f" AND {quote_ident(k)} = ?" for k in keys)
        params = [key[0], key[0] + level, *key[1:]]
        aggs = ", ".join(f"avg({q}), min({q}), max({q})" for q in map(quote_ident, cols))
        row = self._conn.execute(
            f'SELECT count(*){", " + aggs if aggs else ""} FROM {quote_ident(table)} WHERE {where}', params
        ).fetchone()
        if not row or not row[0]:
            return
        names = ["bucket", *keys, "n"]
        for c in cols:
            names += [c, f"{c}__min", f"{c}__max"]
        values = [key[0], *key[1:], *row]
        quoted = ", ".join(map(quote_ident, names))
        self._conn.execute(
            f'INSERT OR REPLACE INTO {quote_ident(name)} ({quoted}) VALUES ({", ".join("?" * len(names))})', values
        )


def _row(key: tuple[float, ...], acc: _Acc, cols: list[str]) -> list[Any]:
    out: list[Any] = [key[0], *(int(k) for k in key[1:]), int(acc["__n__"][0])]
    for c in cols:
        s, cnt, lo, hi = acc.get(c, [0.0, 0.0, np.nan, np.nan])
        if cnt:
            out += [s / cnt, lo, hi]
        else:
            out += [None, None, None]
    return out
