"""Reading part of a published segment straight from its store: its footer, then only the row groups and
columns asked for, each as one ranged request (pyarrow over fsspec).

A segment (:mod:`gpudash.store.segments`) is a Parquet file whose row groups carry min/max statistics of
``_rowid``. :func:`rows_after` keeps the row groups that hold rows after a cursor (a live run's reader that
meets a merged segment covering rows it holds already fetches only the groups past them), and
:func:`read_published` reads a few columns of a table of a run in a bucket without fetching the others: a
``Store`` of any fsspec filesystem (``s3://``, ``gs://``, ``az://``, ``memory://``, a folder) answers
``cat_file(path, start, end)``, which is all :class:`RangeFile` asks of it. Every bound
:func:`gpudash.store.segments.segment_bounds` puts on a segment's footer holds here too.
"""

from __future__ import annotations

import io
import os
from typing import Any

from gpudash.store.attempts import ATTEMPT_COLUMN, PER_STEP_TABLES, attempt_starts, kept
from gpudash.store.objstore import Store, open_store
from gpudash.store.segments import SEGMENTS_DIR, SegmentRefused, chain, segment_bounds, segment_ranks

__all__ = ["RangeFile", "open_ranged", "read_published", "read_segment", "rows_after"]

#: Bytes read past a request, at least (pyarrow asks for the footer's length, then the footer: one request).
READAHEAD = 64 << 10


class RangeFile(io.RawIOBase):
    """A read-only, seekable file over one object, each read one ranged request (``fs.cat_file``; a file of a
    folder: ``pread`` on a descriptor opened with no link followed) of at least :data:`READAHEAD` bytes;
    :attr:`fetched` counts the bytes that came over the wire."""

    def __init__(self, fs: Any, path: str, size: int, fd: int | None = None) -> None:
        super().__init__()
        self.fs, self.path, self.size, self.fd = fs, path, int(size), fd
        self.pos = 0
        self.fetched = 0
        self.requests = 0
        self._buf_at, self._buf = 0, b""

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        super().close()

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = max(0, base + int(offset))
        return self.pos

    def readinto(self, b: Any) -> int:
        want = min(len(b), self.size - self.pos)
        if want <= 0:
            return 0
        if not (self._buf_at <= self.pos and self.pos + want <= self._buf_at + len(self._buf)):
            end = min(self.size, self.pos + max(want, READAHEAD))
            if self.fd is not None:
                self._buf = os.pread(self.fd, end - self.pos, self.pos)
            else:
                self._buf = bytes(self.fs.cat_file(self.path, start=self.pos, end=end))
            self._buf_at = self.pos
            self.fetched += len(self._buf)
            self.requests += 1
        start = self.pos - self._buf_at
        chunk = self._buf[start:start + want]
        b[:len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)


def open_ranged(store: Store, name: str, size: int | None = None) -> RangeFile:
    """A :class:`RangeFile` over ``name`` in ``store`` (``size``: as a listing gave it; else asked once); an
    object over :data:`gpudash.store.localdisk.MAX_OBJECT_BYTES`, a link, a FIFO or a device is refused
    (:class:`gpudash.store.bounded.UnsafeFile`), as for a whole read."""
    import stat

    from gpudash.store.bounded import UnsafeFile, open_below
    from gpudash.store.localdisk import MAX_OBJECT_BYTES

    full = f"{store.root}/{name}"
    fd = None
    if not store.remote:  # a folder: no link followed below it, a regular file only, as every read of a run folder
        fd = open_below(store.root, name)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise UnsafeFile(f"{name}: not a regular file; not read")
        size = st.st_size
    elif size is None:
        size = int(store.fs.size(full))
    if size > MAX_OBJECT_BYTES:
        if fd is not None:
            os.close(fd)
        raise UnsafeFile(f"{name} is {size:,} bytes, over the {MAX_OBJECT_BYTES:,} read at most; not read")
    return RangeFile(store.fs, full, size, fd)


def rows_after(pf: Any, after: int) -> list[int]:
    """The row groups of a segment that may hold a ``_rowid`` over ``after`` (by their statistics; a group
    without them is kept)."""
    md = pf.metadata
    try:
        col = pf.schema_arrow.get_field_index("_rowid")
    except (KeyError, ValueError):
        return list(range(md.num_row_groups))
    keep = []
    for g in range(md.num_row_groups):
        stats = md.row_group(g).column(col).statistics if col >= 0 else None
        if stats is None or not stats.has_min_max or int(stats.max) > after:
            keep.append(g)
    return keep


def read_segment(store: Store, name: str, columns: list[str] | None = None, after: int = 0,
                 size: int | None = None) -> tuple[Any, RangeFile]:
    """The rows of one segment with ``_rowid`` over ``after``, only ``columns`` (and ``_rowid``) of them
    (all when None; a column the file lacks is left out), as an Arrow table; and the file (its counts)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpudash.store.segments import decoded_batch

    with open_ranged(store, name, size) as f:
        pf, _text = segment_bounds(f, name, f.size)
        names = pf.schema_arrow.names
        cols = None if columns is None else ["_rowid", *(c for c in columns if c in names and c != "_rowid")]
        batches = [decoded_batch(b) for b in pf.iter_batches(row_groups=rows_after(pf, after), columns=cols,
                                                         use_threads=False)]
    schema = pf.schema_arrow if cols is None else pa.schema([pf.schema_arrow.field(c) for c in cols])
    tab = pa.Table.from_batches(batches) if batches else schema.empty_table()
    if tab.num_rows:
        tab = tab.filter(pc.greater(tab.column("_rowid"), after))
    return tab, f


def read_published(location: str | Store, table: str, columns: list[str] | None = None, after: int = 0, *,
                   superseded: bool = False) -> Any:
    """One published table of a run (a folder or a URL) read straight from its store: every rank's segments
    that chain past ``after`` (the ``_rowid`` cursor: a live run's new rows), only ``columns`` of them, as one
    Arrow table with a ``rank`` column. A damaged segment raises :class:`SegmentRefused` naming it.

    A run resumed from a checkpoint (:mod:`gpudash.store.attempts`) redoes steps: rows of a per-step table
    (``steps``, ``memory``, ``activations``) that a later attempt of their rank redid are left out, as every
    other reader of the run leaves them out, and an ``attempt`` column comes with the rows when the run has
    more than one (``superseded=True``: every row, as stored). Past a cursor, the rows a caller already holds
    are its own to drop: a new attempt's first step is the smallest ``step`` among its rows (the ``steps``
    table's; for ``memory`` and ``activations`` that table's ``step`` and ``attempt`` are read too)."""
    store = location if isinstance(location, Store) else open_store(location)
    per_step = table in PER_STEP_TABLES and not superseded
    extra = [] if columns is None or not per_step else [c for c in ("step", ATTEMPT_COLUMN) if c not in columns]
    tab = _read_ranks(store, table, None if columns is None else [*columns, *extra], after)
    if per_step and tab.num_rows:
        import pyarrow as pa

        steps = tab if table == "steps" else _read_ranks(store, "steps", ["step", ATTEMPT_COLUMN], 0)
        starts = attempt_starts(_frame(steps))
        if starts:
            tab = tab.filter(pa.array(kept(_frame(tab), starts)))
    return tab.drop_columns([c for c in extra if c in tab.column_names and c != ATTEMPT_COLUMN])


def _frame(tab: Any) -> Any:
    """The ``rank``, ``step`` and ``attempt`` columns of an Arrow table (those it has), as a pandas frame."""
    import pandas as pd

    return pd.DataFrame({c: tab.column(c).to_numpy(zero_copy_only=False)
                         for c in ("rank", "step", ATTEMPT_COLUMN) if c in tab.column_names})


def _read_ranks(store: Store, table: str, columns: list[str] | None, after: int) -> Any:
    import pyarrow as pa

    parts = []
    for rank, tables in sorted(segment_ranks(store.find(SEGMENTS_DIR)).items()):
        for _a, _l, name in chain(tables.get(table, []), after):
            try:
                tab, _f = read_segment(store, name, columns, after)
            except SegmentRefused as exc:
                raise SegmentRefused(f"{name}: {exc}") from None
            parts.append(tab.append_column("rank", pa.array([rank] * tab.num_rows, type=pa.int64())))
    if not parts:
        return pa.table({"_rowid": pa.array([], type=pa.int64()), "rank": pa.array([], type=pa.int64())})
    tab = pa.concat_tables(parts, promote_options="default")
    return tab.select([*(c for c in tab.column_names if c != "rank"), "rank"])  # (a column only later segments have)
