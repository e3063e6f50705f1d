"""The steps table's rows on their way out of the training thread, packed on the thread that makes them.

Every step hands its row (a dict) to :meth:`StepLog.put`. A row of plain numbers (``int``, ``float``, ``bool``)
with the keys of the row before it, as nearly every step's has, is packed into the open block: its values taken
in the block's key order by one ``operator.itemgetter`` call (which also proves the keys: a row of as many keys
that lacks one raises) and packed by one ``struct.Struct.pack``, the row's bytes stored in its slot of the block's list (issue 41:
~7,000 instructions a row where a key tuple compared and a ``pack_into`` of the values into a preallocated
``bytearray`` took ~9,700). The dict and its numbers are then let go on the training thread that made them, and
another thread reads only the rows' bytes (small ``bytes`` objects, from Python's own allocator, not malloc's
per-thread caches, whichever thread lets them go): a queued row holds ~184 bytes where its dict held 1,129 (a
preallocated buffer held 142, for ~2,100 instructions more a step), and the writer stores a block's rows as
tuples in one statement, no dict a row, and keeps their columnar copy as a float matrix read from the same bytes (:func:`_matrix`, which the leak window's
:func:`numbers` reads too), no value checked one by one (``benchmarks/RESULTS.md``, issue 41: the writer's CPU a
row 8-10 µs, was 12-14; 55k instructions a row, was 64k). Any other row (new keys, a text value, ``None``,
an integer beyond 64 bits, a row marked by :func:`mark_unpacked`) goes into a block of rows as they are; a row
of the block's keys in another order is packed in the block's order; a run whose keys change every step or two stops trying to pack for a block's worth of rows. An int
logged under a key whose block began with a float is packed as a float (as a REAL column stores it; exact
below 2**53), and a bool as an int (as SQLite stores it).

Readers take rows in order through a :class:`Cursor` (:meth:`StepLog.take`): the writer's (required: a block
is let go only once the writer has read it) and the leak watch window's (best effort: it keeps blocks for
:data:`SPARE_ROWS` more at most). The training thread never waits: it writes only the open block (which it
alone writes) and appends to a deque; readers take a lock among themselves, which the training thread takes
only to trim a queue past ``capacity`` rows (a writer that cannot keep up), counting the rows it drops. Every
reader reads a block's row count once, then only the rows below it: a row is counted after it is packed.
"""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from operator import itemgetter
from typing import Any, TypeVar

import numpy as np

__all__ = ["BLOCK_ROWS", "PACKED", "SPARE_ROWS", "Block", "Cursor", "Packed", "StepLog", "drop_oldest", "last_step_of",
           "mark_unpacked", "numbers", "record_rows", "records"]

BLOCK_ROWS = 64
"""Rows of one block (the recorder's is its ``flush_rows``: a full block wakes the writer, and lends it the GIL
when it is behind). Blocks of 256 rows made a loop that holds the GIL faster only by putting the writer's work
off: it fell 40,000 rows behind in 3 s of 10 µs steps (``benchmarks/RESULTS.md``)."""
SPARE_ROWS = 4096
"""Rows kept for a best-effort reader past what the writer has read (the leak window's 4,096), in whole blocks
and two more."""
_CODECS = 64
"""Row layouts whose ``struct.Struct`` is kept (made once, not per block: each holds a malloc'd table freed on the
thread that lets its block go)."""
_NUMBERS = frozenset({int, float, np.int64, np.int32, np.float64, np.float32})
"""The values :func:`numbers` reads from a row as it was put (a tensor above all is NaN: never read, never synced)."""
_EARLY = 8
"""A packed block closed by a different row before this many rows closed early; after two such in a row the
log stops packing for a block's worth of rows (keys that change every step would make a block per row)."""

UNPACKED: Any = None
"""The key :func:`mark_unpacked` sets: the writer's table tag (``gpudash.store.tables.TABLE_TAG``), never a
column, so the writer reads such a row as it reads every other table's."""


def mark_unpacked(row: dict[Any, Any]) -> None:
    """Keep ``row`` out of the packed blocks: it holds a value that is not a plain number (a tensor the writer
    reads later). Packing calls ``__float__``/``__index__`` on what it is handed, and on a GPU tensor that is a
    sync on the training thread; with this key the row's keys match no packed block, and its value is text."""
    row[UNPACKED] = "steps"


class _Key:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


PACKED: Any = _Key("packed rows")
"""The key of the writer's record that stands for a span of packed rows (its value is a :class:`Packed`)."""


class Packed:
    """Rows of packed blocks of the same keys as the writer stores them: the keys, each row's values in their
    order, and the same values as one float matrix (a row a row, a column a key: the columnar copy's, read
    from the bytes, with no value checked or converted one by one)."""

    __slots__ = ("_parts", "keys", "rows")

    def __init__(self, keys: tuple[Any, ...], rows: list[tuple[Any, ...]], matrix: np.ndarray) -> None:
        self.keys = keys
        self.rows = rows
        self._parts = [matrix]

    def extend(self, rows: Any, matrix: np.ndarray) -> None:
        self.rows += rows
        self._parts.append(matrix)

    @property
    def matrix(self) -> np.ndarray:
        if len(self._parts) > 1:
            self._parts = [np.concatenate(self._parts)]
        return self._parts[0]


@lru_cache(maxsize=64)
def _int_columns(fmt: str) -> list[int]:
    """The columns of a packed layout that hold integers (``q``; the others are ``d``)."""
    return [i for i, c in enumerate(fmt[1:]) if c == "q"]


def _bytes(b: Block, start: int, end: int) -> bytes:
    """Rows ``[start, end)`` of packed block ``b``, their bytes end to end."""
    assert b.parts is not None
    return b"".join(b.parts[start:end])


def _matrix(b: Block, data: bytes) -> np.ndarray:
    """``data`` (rows of packed block ``b``, :func:`_bytes`) as a float matrix. Every value is 8 bytes (``d`` or
    ``q``, no padding): the bytes read as floats, the integer columns read again as integers and converted (exact
    below 2**53, as SQLite's REAL and the writer's ``float()`` are)."""
    assert b.codec is not None
    k = len(b.codec.format) - 1
    m = len(data) // (8 * k)
    out = np.frombuffer(data, dtype="<f8", count=m * k).reshape(m, k).copy()
    ints = _int_columns(b.codec.format)
    if ints:
        out[:, ints] = np.frombuffer(data, dtype="<i8", count=m * k).reshape(m, k)[:, ints]
    return out


def _getter(keys: tuple[Any, ...]) -> Callable[[dict[Any, Any]], tuple[Any, ...]]:
    """A row's values under ``keys``, in their order, as a tuple (``itemgetter`` of one key returns the value)."""
    if len(keys) == 1:
        key = keys[0]
        return lambda row: (row[key],)
    return itemgetter(*keys)


class Block:
    """``cap`` rows: packed (``keys`` and ``codec`` set, each row's bytes in ``parts``) or rows as they are
    (``rows``)."""

    __slots__ = ("cap", "codec", "get", "keys", "n", "nkeys", "parts", "rows", "seq")

    def __init__(self, seq: int, cap: int, keys: tuple[Any, ...] | None = None,
                 codec: struct.Struct | None = None) -> None:
        self.seq = seq
        self.cap = cap
        self.n = 0
        self.keys = keys
        self.codec = codec
        packed = keys is not None and codec is not None
        #: rows of this many keys are tried against the block's (-1: rows as they are, none is)
        self.nkeys = len(keys) if packed else -1  # type: ignore[arg-type]
        self.get = _getter(keys) if packed else None  # type: ignore[arg-type]
        #: made whole (64 slots: 512 bytes, Python's allocator) rather than grown row by row (reallocations, the
        #: last ones malloc's, freed on the reader's thread)
        self.parts: list[bytes] | None = [b""] * cap if packed else None
        self.rows: list[dict[Any, Any]] | None = None if packed else []


_CLOSED = Block(-1, 0)  # before the first row: full, so the first put opens a block


class Cursor:
    """Where one reader is: the next row to read is row ``row`` of block ``seq``."""

    __slots__ = ("missed", "required", "row", "seq", "taken")

    def __init__(self, required: bool) -> None:
        self.required = required
        self.seq = 0
        self.row = 0
        self.taken = 0
        """Rows read so far."""
        self.missed = 0
        """Rows let go before this reader read them (a best-effort reader that fell behind)."""


T = TypeVar("T")
Span = tuple[Block, int, int]
"""Rows ``[start, end)`` of a block."""


def _format(row: dict[Any, Any]) -> str | None:
    """The ``struct`` format of ``row``'s values (little-endian, no padding), None when one is not a plain number."""
    codes = []
    for v in row.values():
        t = v.__class__
        if t is float:
            codes.append("d")
        elif t is int or t is bool:
            codes.append("q")
        else:
            return None
    return "<" + "".join(codes)


class StepLog:
    """The step rows of one recorder, in blocks, until its readers have taken them (see the module doc)."""

    def __init__(self, capacity: int, block_rows: int = BLOCK_ROWS,
                 on_block: Callable[[int], None] | None = None) -> None:
        self.capacity = capacity
        self.block_rows = max(1, block_rows)
        self.spare_blocks = -(-SPARE_ROWS // self.block_rows) + 2
        #: called on the recording thread when it opens a block, with the rows the writer has not taken
        self.on_block = on_block
        self._blocks: deque[Block] = deque()
        self._open = _CLOSED
        self._seq = 0
        self._early = 0  # packed blocks closed early, in a row
        self._closed_rows = 0  # rows in the blocks before the open one
        self._codecs: dict[str, struct.Struct] = {}  # one per row layout seen (a Struct holds a malloc'd table)
        self._lock = threading.Lock()
        self.writer = Cursor(required=True)
        self._cursors = [self.writer]
        self.dropped = 0
        """Rows the writer never read: let go past ``capacity`` (oldest first)."""

    # ---- the recording thread -------------------------------------------------------------
    def put(self, row: dict[Any, Any]) -> None:
        """Queue one step's row (the log's from now on). Never blocks, never raises for a value."""
        b = self._open
        n = b.n
        if n < b.cap:
            if len(row) == b.nkeys:
                try:  # (a missing key raises: a row of as many keys has the block's keys)
                    b.parts[n] = b.codec.pack(*b.get(row))  # type: ignore[index, misc, union-attr]
                except (KeyError, struct.error, TypeError, ValueError, OverflowError):
                    pass  # (other keys, or a value of another type under a key: a block for this row)
                else:
                    b.n = n + 1
                    return
            elif b.rows is not None:
                b.rows.append(row)
                b.n = n + 1
                return
        self._put_new(row)

    def _put_new(self, row: dict[Any, Any]) -> None:
        """``row`` does not go into the open block: open one for it."""
        old = self._open
        if old.keys is not None:  # a packed block, full or closed by a row of other keys or types
            self._early = self._early + 1 if old.n < _EARLY else 0
        fmt = _format(row) if self._early < 2 else None
        if fmt is not None:
            codec = self._codecs.get(fmt)
            if codec is None:
                codec = struct.Struct(fmt)
                if len(self._codecs) < _CODECS:
                    self._codecs[fmt] = codec
            try:
                data = codec.pack(*row.values())
            except (struct.error, TypeError, ValueError, OverflowError):  # (an integer beyond 64 bits)
                pass
            else:
                b = self._open_block(tuple(row), codec)
                b.parts[0] = data  # type: ignore[index]
                b.n = 1
                return
        self._early = 0  # a block of rows as they are; the block after it tries packing again
        b = self._open_block(None, None)
        b.rows.append(row)  # type: ignore[union-attr]
        b.n = 1

    def _open_block(self, keys: tuple[Any, ...] | None, codec: struct.Struct | None) -> Block:
        old = self._open
        self._closed_rows += old.n
        b = Block(self._seq, self.block_rows, keys, codec)
        self._seq += 1
        self._blocks.append(b)  # before any row is in it: a reader that sees it knows the block before is done
        self._open = b
        waiting = self._closed_rows - self.writer.taken - self.dropped
        if waiting > self.capacity:
            with self._lock:
                self._trim(self.capacity)
                waiting = self.capacity
        if self.on_block is not None and waiting > 0:
            self.on_block(waiting)
        return b

    # ---- readers ------------------------------------------------------------------------------
    def cursor(self) -> Cursor:
        """A best-effort reader starting at the oldest row still kept."""
        c = Cursor(required=False)
        with self._lock:
            if self._blocks:
                c.seq = self._blocks[0].seq
            self._cursors.append(c)
        return c

    def release(self, cursor: Cursor) -> None:
        """The reader is done: nothing is kept for it."""
        with self._lock:
            if cursor in self._cursors and not cursor.required:
                self._cursors.remove(cursor)

    def take(self, cursor: Cursor, read: Callable[[list[Span]], T], limit: int | None = None) -> T:
        """``read`` of the rows ``cursor`` has not read (at most ``limit``; spans of blocks, oldest first), called
        under the lock (a block let go is reused: its bytes are valid only there); the cursor moves past them."""
        spans: list[Span] = []
        got = 0
        with self._lock:
            if cursor.required:
                self._trim(self.capacity)
            blocks = list(self._blocks)
            if blocks and cursor.seq < blocks[0].seq:  # let go before this reader read them (counted by _prune)
                cursor.seq, cursor.row = blocks[0].seq, 0
            for b in blocks:
                if b.seq < cursor.seq:
                    continue
                start = cursor.row if b.seq == cursor.seq else 0
                end = b.n if limit is None else min(b.n, start + limit - got)
                if end > start:
                    spans.append((b, start, end))
                    got += end - start
                cursor.seq, cursor.row = b.seq, max(start, end)
                if limit is not None and got >= limit:
                    break
            cursor.taken += got
            try:
                return read(spans)
            finally:
                self._prune()

    def waiting(self) -> int:
        """Rows put that the writer has not taken (nor were let go)."""
        return self._closed_rows + self._open.n - self.writer.taken - self.dropped

    def _passed(self, c: Cursor, b: Block) -> bool:
        return c.seq > b.seq or (c.seq == b.seq and c.row >= b.n)

    def _prune(self) -> None:
        """Let go of the closed blocks every required reader has read (and every best-effort one, or past
        :data:`SPARE_ROWS`). Under the lock."""
        blocks = self._blocks
        while len(blocks) > 1:  # (the newest block is open: the recording thread may add to it)
            b = blocks[0]
            if not all(self._passed(c, b) for c in self._cursors if c.required):
                return
            if len(blocks) <= self.spare_blocks and any(not self._passed(c, b) for c in self._cursors):
                return
            self._let_go_front()

    def _trim(self, keep: int) -> None:
        """The writer's unread rows past ``keep``: the oldest are let go and counted (under the lock)."""
        w = self.writer
        over = self.waiting() - keep
        blocks = self._blocks
        while over > 0 and blocks:
            b = blocks[0]
            if b.seq < w.seq:  # read by the writer, kept for another reader: let go first
                self._let_go_front()
                continue
            start = w.row if b.seq == w.seq else 0
            skip = min(over, b.n - start)
            self.dropped += skip
            over -= skip
            w.seq, w.row = b.seq, start + skip
            if w.row >= b.n and len(blocks) > 1:
                self._let_go_front()
                w.seq, w.row = blocks[0].seq, 0
            elif over > 0:
                break  # (the open block: nothing more to let go)

    def _let_go_front(self) -> None:
        b = self._blocks.popleft()
        for c in self._cursors:
            if not c.required and not self._passed(c, b):
                c.missed += b.n - (c.row if c.seq == b.seq else 0)
                c.seq, c.row = b.seq + 1, 0


def records(spans: list[Span]) -> list[dict[Any, Any]]:
    """The writer's records of ``spans``: a span of packed rows is one record (``PACKED``: a :class:`Packed`),
    a row as it was put is its own; each carries the writer's table tag (the key :data:`UNPACKED`)."""
    tag = UNPACKED
    out: list[dict[Any, Any]] = []
    last: Packed | None = None
    for b, start, end in spans:
        if b.codec is not None:
            data = _bytes(b, start, end)
            if last is not None and last.keys == b.keys:  # blocks of the same keys: one record (one statement)
                last.extend(b.codec.iter_unpack(data), _matrix(b, data))
                continue
            last = Packed(b.keys, list(b.codec.iter_unpack(data)), _matrix(b, data))  # type: ignore[arg-type]
            out.append({tag: "steps", PACKED: last})
        else:
            last = None
            for row in b.rows[start:end]:  # type: ignore[index]
                row[tag] = "steps"
                out.append(row)
    return out


def numbers(spans: list[Span], names: tuple[str, ...]) -> tuple[int, dict[str, np.ndarray]]:
    """The rows of ``spans`` as float columns of ``names`` (NaN where a row has no such number): the leak
    window's copy, read without building a dict per row."""
    total = sum(end - start for _, start, end in spans)
    out = {name: np.full(total, np.nan) for name in names}
    at = 0
    for b, start, end in spans:
        m = end - start
        if b.codec is not None:
            assert b.keys is not None
            mat = _matrix(b, _bytes(b, start, end))
            for name in names:
                try:
                    i = b.keys.index(name)
                except ValueError:
                    continue
                out[name][at:at + m] = mat[:, i]
        else:
            rows = b.rows[start:end]  # type: ignore[index]
            for name in names:
                col = out[name]
                for j, row in enumerate(rows):
                    v = row.get(name)
                    if v.__class__ in _NUMBERS:
                        col[at + j] = v
        at += m
    return total, out


def record_rows(items: list[dict[Any, Any]]) -> int:
    """Rows in the writer's ``items`` (a record of packed step rows holds many)."""
    return sum(len(r[PACKED].rows) if PACKED in r else 1 for r in items)


def drop_oldest(items: list[dict[Any, Any]], rows: int) -> int:
    """Delete the oldest records of ``items`` until at least ``rows`` rows are gone (or none is left); the
    rows deleted."""
    k = cut = 0
    while cut < rows and k < len(items):
        cut += record_rows(items[k:k + 1])
        k += 1
    del items[:k]
    return cut


def last_step_of(record: dict[Any, Any], default: Any) -> Any:
    """The ``step`` of a ``steps`` record's last row (``default`` when it has none)."""
    packed = record.get(PACKED)
    if packed is None:
        return record.get("step", default)
    if "step" not in packed.keys or not packed.rows:
        return default
    return packed.rows[-1][packed.keys.index("step")]
