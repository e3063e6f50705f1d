"""Columnar copies of the numeric tables, so ``load_run`` of a long run is fast.

SQLite hands rows back one Python object per value (~0.2 µs each): a
million steps with 17 columns would take seconds. So, beside the plain rows
(which stay the readable source of truth), the writer stores the numeric
columns of each table as *chunks*: a float64 array per column covering a
contiguous rowid range. The reader concatenates chunks with ``np.frombuffer``
and reads only the rows after the last chunk through SQL. A damaged chunk is
ignored: the reader falls back to the rows.

A chunk is written once, whole, when :data:`CHUNK_ROWS` rows (or
:data:`CHUNK_VALUES` values) have been inserted since the last one, and at
close; never rewritten. Every page a transaction touches is written whole into
the write-ahead log, so a chunk per flush (the old way: one small chunk every
0.5 s, merged 64 at a time into bigger ones) cost a chunk page, an index page
and, on every merge, the whole merged blob again. The rows since the last
chunk (at most a few thousand) are what a reader reads through SQL; a run
killed before its next chunk, or resumed by a new writer, keeps them as rows,
and the next writer chunks them with its own.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from dataclasses import dataclass

import numpy as np

from gpudash.store.schema import quote_ident
from gpudash.store.values import num

__all__ = ["CHUNK_ROWS", "CHUNK_VALUES", "Chunk", "ChunkWriter", "encode", "read_chunks"]

CHUNK_TABLE = "colchunks"
_CT = quote_ident(CHUNK_TABLE)
#: Rows per chunk (a table's chunk is written when this many rows wait) ...
CHUNK_ROWS = 4096
#: ... or when this many values wait (a table of many columns: the rows left to SQL stay few).
CHUNK_VALUES = 1 << 16


@dataclass(slots=True)
class Chunk:
    first_rowid: int
    last_rowid: int
    columns: dict[str, np.ndarray]


def encode(arr: np.ndarray) -> bytes:
    """``arr`` is (rows, columns) float64; stored column-major."""
    return np.ascontiguousarray(arr.T, dtype="<f8").tobytes()


def _merge(parts: list[tuple[list[str], np.ndarray]]) -> tuple[list[str], np.ndarray]:
    """Blocks of rows with possibly different columns as one (rows, union of columns) matrix."""
    cols: list[str] = []
    for names, _ in parts:
        cols += [c for c in names if c not in cols]
    if all(names == cols for names, _ in parts):
        return cols, np.concatenate([a for _, a in parts]) if len(parts) > 1 else parts[0][1]
    blocks = []
    for names, arr in parts:
        full = np.full((len(arr), len(cols)), np.nan)
        for j, c in enumerate(names):
            full[:, cols.index(c)] = arr[:, j]
        blocks.append(full)
    return cols, np.concatenate(blocks)


class _Pending:
    """One table's rows inserted since its last chunk: in ``block`` (a matrix of a chunk's size, allocated
    before its first row; its first ``rows`` rows hold them) while they come with the same columns and fit,
    else as ``parts``."""

    __slots__ = ("block", "first", "names", "parts", "rows", "values")

    def __init__(self, first: int) -> None:
        self.first = first  # rowid of the first row not in a chunk
        self.rows = 0
        self.values = 0
        self.parts: list[tuple[list[str], np.ndarray]] = []
        self.block: np.ndarray | None = None
        self.names: list[str] = []

    def copy(self) -> _Pending:
        """What to go back to on a rollback (the block is shared: only rows past ``rows`` are written to it)."""
        out = _Pending(self.first)
        out.rows, out.values, out.parts = self.rows, self.values, list(self.parts)
        out.block, out.names = self.block, self.names
        return out

    def fits(self, n: int) -> bool:
        """``n`` more rows go into the block (rows since the last chunk all went there)."""
        b = self.block
        return not self.parts and b is not None and self.rows + n <= len(b)

    def add(self, columns: list[str], arr: np.ndarray) -> None:
        n = len(arr)
        if self.fits(n):
            assert self.block is not None
            self._into_block(columns, arr)
        else:
            if not self.parts and self.rows:  # from now on as parts (the block is not written again)
                assert self.block is not None
                self.parts.append((self.names, self.block[:self.rows]))
            self.parts.append((columns, arr))
        self.rows += n
        self.values += arr.size

    def _into_block(self, columns: list[str], arr: np.ndarray) -> None:
        """Rows of ``columns`` into the block's next rows. Columns come and go between flushes (a step that
        measured activations has two more): the block's columns are every one seen since the last chunk, a
        row's missing ones NaN (as the table reads them), and a new column widens the block (rarely; no rows
        kept aside as pieces, so what the writer holds between chunks stays one block)."""
        b, r, n = self.block, self.rows, len(arr)
        assert b is not None
        if not r:
            self.names = list(columns)
        if columns == self.names and b.shape[1] == len(columns):
            b[r:r + n] = arr
            return
        new = [c for c in columns if c not in self.names]
        if new:
            names = [*self.names, *new]
            wide = np.empty((len(b), len(names)))
            wide[:r, :b.shape[1]] = b[:r]
            wide[:r, b.shape[1]:] = np.nan
            self.block, self.names, b = wide, names, wide
        at = {c: j for j, c in enumerate(self.names)}
        b[r:r + n] = np.nan
        b[r:r + n, [at[c] for c in columns]] = arr

    def merged(self) -> tuple[list[str], np.ndarray]:
        if not self.parts:
            assert self.block is not None
            return self.names, self.block[:self.rows]
        return _merge(self.parts)


class ChunkWriter:
    """Keeps each numeric table's unchunked rows in memory and writes them as one chunk when enough wait.

    Runs inside the caller's transactions: :meth:`begin` / :meth:`rollback` keep what it holds
    in step with what the database holds."""

    def __init__(self, conn: sqlite3.Connection, rows: int | None = None, values: int | None = None) -> None:
        self._conn = conn
        self._rows = CHUNK_ROWS if rows is None else rows
        self._values = CHUNK_VALUES if values is None else values
        self._pending: dict[str, _Pending] = {}
        self._saved: dict[str, _Pending] = {}
        # a table's block whose chunk was written, for its next rows once that transaction has committed (a
        # rollback goes back to it): one block a table, taken at its first rows, not grown over a chunk's rows
        self._spare: dict[str, np.ndarray] = {}
        self._retired: dict[str, np.ndarray] = {}
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_CT} (id INTEGER PRIMARY KEY, tbl TEXT, level INTEGER,"
            " first_rowid INTEGER, last_rowid INTEGER, columns TEXT, data BLOB, crc INTEGER)"
        )
        conn.execute(f"CREATE INDEX IF NOT EXISTS {quote_ident(CHUNK_TABLE + '_tbl')} ON {_CT}(tbl, level, first_rowid)")

    def begin(self) -> None:
        self._saved = {t: p.copy() for t, p in self._pending.items()}
        self._spare.update(self._retired)  # the transaction that wrote their chunks committed
        self._retired = {}

    def rollback(self) -> None:
        self._pending = self._saved
        self._saved = {}
        self._retired = {}  # the chunks were not written: their blocks hold the rows again

    def append(self, table: str, first_rowid: int, columns: list[str], arr: np.ndarray) -> None:
        """Rows ``first_rowid ..`` of ``table`` were inserted (``arr``: rows x ``columns``, float64)."""
        if not len(arr):
            return
        pend = self._pending.get(table)
        if pend is None:
            pend = self._pending[table] = self._resume(table, first_rowid)
        if pend.first + pend.rows != first_rowid:  # rows written by someone else since: start afresh
            pend = self._pending[table] = _Pending(first_rowid)
        if not pend.rows and not pend.parts:
            self._give_block(table, pend, len(columns))
        pend.add(columns, arr)
        if pend.rows >= self._rows or pend.values >= self._values:
            self._write(table, pend)

    def _give_block(self, table: str, pend: _Pending, ncols: int) -> None:
        """A block of a chunk's rows of ``ncols`` columns for ``pend``: the table's block whose chunk is written
        (once that transaction committed), a new one the first time or when the columns changed."""
        shape = (min(self._rows, -(-self._values // max(1, ncols))), ncols)
        block = pend.block if pend.block is not None and pend.block.shape == shape else self._spare.pop(table, None)
        pend.block = block if block is not None and block.shape == shape else np.empty(shape)

    def write_all(self) -> None:
        """Write every table's waiting rows as a chunk (at close: a finished run reads no rows through SQL)."""
        for table, pend in self._pending.items():
            if pend.rows:
                self._write(table, pend)

    def _write(self, table: str, pend: _Pending) -> None:
        cols, arr = pend.merged()
        last = pend.first + pend.rows - 1
        data = encode(arr)
        self._conn.execute(
            f"INSERT INTO {_CT} (tbl, level, first_rowid, last_rowid, columns, data, crc)"
            " VALUES (?, 0, ?, ?, ?, ?, ?)",
            (table, pend.first, last, json.dumps(cols), data, zlib.crc32(data)),
        )
        self._pending[table] = _Pending(last + 1)
        if pend.block is not None:
            self._retired[table] = pend.block

    def _resume(self, table: str, first_rowid: int) -> _Pending:
        """The first rows this writer inserts into ``table``: pick up the rows an earlier writer of
        this file left unchunked (a killed or resumed run), so the chunks stay contiguous."""
        try:
            covered = self._conn.execute(f"SELECT max(last_rowid) FROM {_CT} WHERE tbl = ?", (table,)).fetchone()[0]
        except sqlite3.Error:
            covered = None
        start = int(covered or 0) + 1
        if start >= first_rowid or first_rowid - start > 4 * self._rows:
            return _Pending(first_rowid)
        try:
            info = list(self._conn.execute(f"PRAGMA table_info({quote_ident(table)})"))
            cols = [name for _, name, ctype, *_ in info if ctype in ("REAL", "INTEGER")]
            quoted = ", ".join(["rowid", *map(quote_ident, cols)])
            rows = self._conn.execute(f"SELECT {quoted} FROM {quote_ident(table)} WHERE rowid >= ? AND rowid < ?"
                                      " ORDER BY rowid", (start, first_rowid)).fetchall()
        except sqlite3.Error:
            return _Pending(first_rowid)
        if not cols or len(rows) != first_rowid - start or rows[0][0] != start:
            return _Pending(first_rowid)  # rowids with holes: no contiguous chunk can cover them
        pend = _Pending(start)
        arr = np.array([[num(v) for v in r[1:]] for r in rows], dtype=float).reshape(len(rows), len(cols))
        pend.add(cols, arr)
        return pend


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
