"""Columnar copies of the numeric tables, so ``load_run`` of a long run is fast.

SQLite hands rows back one Python object per value (~0.2 µs each): a
million steps with 17 columns would take seconds. So, beside the plain rows
(which stay the readable source of truth), the writer stores every flushed
batch of a numeric table as one *chunk*: a float64 array per column covering
a contiguous rowid range. Chunks are merged 64 at a time into bigger ones
(levels), so even a week of 0.5 s flushes stays a few hundred chunks. The
reader concatenates chunks with ``np.frombuffer`` and reads only the rows
after the last chunk through SQL. A damaged chunk is ignored: the reader
falls back to the rows.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from dataclasses import dataclass

import numpy as np

from gpudash.store.schema import quote_ident

__all__ = ["Chunk", "ChunkWriter", "decode", "encode", "read_chunks"]

CHUNK_TABLE = "colchunks"
_CT = quote_ident(CHUNK_TABLE)
MERGE_FANOUT = 64


@dataclass(slots=True)
class Chunk:
    first_rowid: int
    last_rowid: int
    columns: dict[str, np.ndarray]


def encode(columns: list[str], arr: np.ndarray) -> bytes:
    """``arr`` is (rows, len(columns)) float64; stored column-major."""
    return np.ascontiguousarray(arr.T, dtype="<f8").tobytes()


def decode(columns: list[str], n: int, data: bytes) -> dict[str, np.ndarray]:
    flat = np.frombuffer(data, dtype="<f8")
    if flat.size != n * len(columns):
        raise ValueError(f"chunk holds {flat.size} values, expected {n * len(columns)}")
    mat = flat.reshape(len(columns), n)
    return {c: mat[i] for i, c in enumerate(columns)}


def _merge(chunks: list[Chunk]) -> tuple[list[str], np.ndarray]:
    cols: list[str] = []
    for ch in chunks:
        cols += [c for c in ch.columns if c not in cols]
    parts = []
    for ch in chunks:
        n = ch.last_rowid - ch.first_rowid + 1
        parts.append(np.column_stack([ch.columns.get(c, np.full(n, np.nan)) for c in cols]))
    return cols, np.concatenate(parts)


class ChunkWriter:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_CT} (id INTEGER PRIMARY KEY, tbl TEXT, level INTEGER,"
            " first_rowid INTEGER, last_rowid INTEGER, columns TEXT, data BLOB, crc INTEGER)"
        )
        conn.execute(f"CREATE INDEX IF NOT EXISTS {quote_ident(CHUNK_TABLE + '_tbl')} ON {_CT}(tbl, level, first_rowid)")

    def append(self, table: str, first_rowid: int, columns: list[str], arr: np.ndarray) -> None:
        last = first_rowid + len(arr) - 1
        self._put(table, 0, first_rowid, last, columns, arr)
        level = 0
        while self._compact(table, level):
            level += 1

    def _put(self, table: str, level: int, first: int, last: int, columns: list[str], arr: np.ndarray) -> None:
        data = encode(columns, arr)
        self._conn.execute(
            f"INSERT INTO {_CT} (tbl, level, first_rowid, last_rowid, columns, data, crc)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (table, level, first, last, json.dumps(columns), data, zlib.crc32(data)),
        )

    def _compact(self, table: str, level: int) -> bool:
        rows = self._conn.execute(
            f"SELECT id, first_rowid, last_rowid, columns, data FROM {_CT}"
            " WHERE tbl = ? AND level = ? ORDER BY first_rowid",
            (table, level),
        ).fetchall()
        if len(rows) < MERGE_FANOUT:
            return False
        chunks = [Chunk(f, la, decode(json.loads(c), la - f + 1, d)) for _, f, la, c, d in rows]
        cols, arr = _merge(chunks)
        self._conn.executemany(f"DELETE FROM {_CT} WHERE id = ?", [(r[0],) for r in rows])
        self._put(table, level + 1, chunks[0].first_rowid, chunks[-1].last_rowid, cols, arr)
        return True


def read_chunks(conn: sqlite3.Connection, table: str) -> tuple[list[str], np.ndarray | None, int]:
    """Concatenate a table's chunks into one (columns, rows) float64 matrix.

    Returns ``(names, matrix, last rowid covered)``; stops at the first gap or
    damaged chunk (the caller reads the remaining rows through SQL)."""
    try:
        rows = conn.execute(
            f"SELECT first_rowid, last_rowid, columns, data, crc FROM {_CT} WHERE tbl = ?"
            " ORDER BY first_rowid",
            (table,),
        ).fetchall()
    except sqlite3.Error:
        return [], None, 0
    parts: list[tuple[list[str], np.ndarray]] = []
    names: list[str] = []
    expect = 1
    for first, last, cols, data, crc in rows:
        if first != expect or zlib.crc32(data) != crc:
            break  # a gap or a damaged chunk: the rows after it are read through SQL
        try:
            cols = json.loads(cols)
            flat = np.frombuffer(data, dtype="<f8")
            if flat.size != (last - first + 1) * len(cols):
                break
        except (ValueError, TypeError):
            break
        parts.append((cols, flat.reshape(len(cols), last - first + 1)))
        names += [c for c in cols if c not in names]
        expect = last + 1
    if not parts:
        return [], None, 0
    blocks = []
    for cols, mat in parts:
        if cols == names:
            blocks.append(mat)
            continue
        full = np.full((len(names), mat.shape[1]), np.nan)
        for i, c in enumerate(cols):
            full[names.index(c)] = mat[i]
        blocks.append(full)
    return names, np.concatenate(blocks, axis=1), expect - 1
