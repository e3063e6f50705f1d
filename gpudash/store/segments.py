"""Append-only segments: one rank's new rows as immutable Parquet files, and reading them back.

Layout of a run published on a shared filesystem or an object store::

    RUN/run.json
    RUN/segments/rank=0/meta.json                                   the rank's meta (rewritten whole)
    RUN/segments/rank=0/steps/000000000000-000000001500.parquet     rows 1..1500 of steps
    RUN/segments/rank=0/steps/000000001500-000000003012.parquet     rows 1501..3012
    RUN/segments/rank=1/...

A segment holds the rows of one table whose SQLite rowid lies in ``(after, last]`` (both in its
name), with the rowid as column ``_rowid``; it is written once and never changed. A merged segment
(compaction) covers the range of the ones it replaces, which are removed after it is in place, so
at every moment the files of a table chain from row 1 to the last row published.

Parquet (pyarrow) because DuckDB, pandas, Polars and Spark read it directly (``rank=N`` is a Hive
partition), it is columnar and compressed (a segment is smaller than the SQLite pages that hold
the same rows) and each file carries its schema, so columns added mid-run need no coordination.

The derived tables (roll-ups, columnar chunks) are not published: :class:`SegmentCache` rebuilds
them on the reading side while it ingests the segments into a private SQLite database, which
:class:`~gpudash.store.rankreader.RankReader` then reads like any rank file.
"""

from __future__ import annotations

import io
import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpudash.store.columns import add_columns, table_columns
from gpudash.store.schema import NUMERIC_TABLES, ROLLUP_TABLES, TABLE_BASE_COLUMNS, quote_ident

__all__ = ["PUBLISHED_TABLES", "SEGMENTS_DIR", "SegmentCache", "SegmentRefused", "decoded_batch", "export_rows", "parse_segment",
           "rank_meta_name", "rank_of_folder", "read_meta_rows", "segment_bounds", "segment_name", "segment_ranks",
           "shift_rowids"]

#: The key of what the runs list shows in a rank's ``meta.json`` (:mod:`gpudash.store.listing`).
LISTING_KEY = "listing"

SEGMENTS_DIR = "segments"
#: The recorded tables (the roll-ups and chunks are derived from them and rebuilt by readers).
PUBLISHED_TABLES = tuple(TABLE_BASE_COLUMNS)
_SEGMENT = re.compile(r"^(\d{12})-(\d{12})\.parquet$")
_RANK = re.compile(r"^rank=(\d{1,10})$")
#: Names a segment's column may not have (SQLite's row id, the reader's own): never a column gpudash writes.
_NOT_COLUMNS = frozenset({"_rowid", "rowid", "oid", "_rowid_", "rank"})
#: Rows per Parquet row group (and per batch read from SQLite when a big range is exported).
BATCH_ROWS = 65_536


def segment_name(rank: int, table: str, after: int, last: int) -> str:
    return f"{SEGMENTS_DIR}/rank={rank}/{table}/{after:012d}-{last:012d}.parquet"


def rank_meta_name(rank: int) -> str:
    return f"{SEGMENTS_DIR}/rank={rank}/meta.json"


def parse_segment(name: str) -> tuple[int, int] | None:
    """(after, last) of a segment file name; None for any other name."""
    m = _SEGMENT.match(name.rsplit("/", 1)[-1])
    if not m:
        return None
    after, last = int(m.group(1)), int(m.group(2))
    return (after, last) if last > after else None


def rank_of_folder(name: str) -> int | None:
    m = _RANK.match(name)
    return int(m.group(1)) if m and int(m.group(1)) <= 2**31 - 1 else None


def segment_ranks(files: list[str]) -> dict[int, dict[str, list[tuple[int, int, str]]]]:
    """Every rank's segments by table, from the names under ``segments/`` (as :meth:`Store.find`
    gives them): ``{rank: {table: [(after, last, name), ...]}}``; a rank with only its meta has ``{}``."""
    out: dict[int, dict[str, list[tuple[int, int, str]]]] = {}
    for name in files:
        parts = name.split("/")
        if len(parts) < 3 or parts[0] != SEGMENTS_DIR:
            continue
        rank = rank_of_folder(parts[1])
        if rank is None:
            continue
        tables = out.setdefault(rank, {})
        if len(parts) == 4 and parts[2] in PUBLISHED_TABLES:
            span = parse_segment(parts[3])
            if span is not None:
                tables.setdefault(parts[2], []).append((*span, name))
    return out


# ---- writing side ---------------------------------------------------------------------------------
def _arrow_type(decl: str) -> Any:
    import pyarrow as pa

    return {"REAL": pa.float64(), "INTEGER": pa.int64(), "TEXT": pa.string(), "BLOB": pa.binary()}.get(
        decl.upper(), pa.string())


def _column(values: list[Any], decl: str) -> Any:
    """One column as an Arrow array of its declared type; values SQLite kept in another type (a
    text in a REAL column) make it a column of text, nothing is dropped."""
    import pyarrow as pa

    try:
        return pa.array(values, type=_arrow_type(decl))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array([None if v is None else (v.hex() if isinstance(v, bytes) else str(v)) for v in values],
                        type=pa.string())


def export_rows(conn: sqlite3.Connection, table: str, after: int, upto: int | None = None,
                out: Path | None = None) -> tuple[bytes | None, int]:
    """The rows of ``table`` with rowid in ``(after, upto]`` as one Parquet file: its bytes (or written to
    ``out``, bytes None) and the last rowid in it (``after`` when there is none: nothing is made)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = [(str(r[1]), str(r[2] or "")) for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
    cols = ", ".join(["rowid", *(quote_ident(c) for c, _ in info)])
    cond = "rowid > ?" + (" AND rowid <= ?" if upto is not None else "")
    params: tuple[int, ...] = (after,) if upto is None else (after, upto)
    cur = conn.execute(f"SELECT {cols} FROM {quote_ident(table)} WHERE {cond} ORDER BY rowid", params)
    sink: Any = str(out) if out is not None else io.BytesIO()
    writer: Any = None
    last = after
    try:
        while True:
            rows = cur.fetchmany(BATCH_ROWS)
            if not rows:
                break
            by_col = list(zip(*rows, strict=True))
            arrays = [pa.array(by_col[0], type=pa.int64())]
            arrays += [_column(list(by_col[i + 1]), decl) for i, (_, decl) in enumerate(info)]
            batch = pa.Table.from_arrays(arrays, names=["_rowid", *(c for c, _ in info)])
            if writer is not None and batch.schema != writer.schema:
                try:
                    batch = batch.cast(writer.schema)
                except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
                    break  # a column changed type mid-range: this file ends here, the caller exports the rest
            if writer is None:
                writer = pq.ParquetWriter(sink, batch.schema, compression="zstd")
            writer.write_table(batch, row_group_size=BATCH_ROWS)
            last = int(rows[-1][0])
    finally:
        cur.close()
        if writer is not None:
            writer.close()
    if writer is None:
        return None, after
    return (None if out is not None else sink.getvalue()), last


def shift_rowids(data: bytes, by: int) -> bytes:
    """A segment's Parquet bytes with every ``_rowid`` raised by ``by`` (a later attempt of a rank numbers
    its rows after the earlier attempts' rows: :mod:`gpudash.store.attempts`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tab = pq.read_table(io.BytesIO(data))
    i = tab.column_names.index("_rowid")
    tab = tab.set_column(i, "_rowid", pc.add(tab.column(i), pa.scalar(by, pa.int64())))
    sink = io.BytesIO()
    pq.write_table(tab, sink, compression="zstd", row_group_size=BATCH_ROWS)
    return sink.getvalue()


def read_meta_rows(conn: sqlite3.Connection) -> dict[str, Any]:
    """The rank's meta table as a dict (values parsed from their JSON)."""
    out: dict[str, Any] = {}
    for key, value in conn.execute("SELECT key, value FROM meta"):
        try:
            out[str(key)] = json.loads(value)
        except (TypeError, ValueError):
            out[str(key)] = value
    return out


# ---- reading side ---------------------------------------------------------------------------------
def _sql_type(arrow_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return "INTEGER"
    if pa.types.is_floating(arrow_type):
        return "REAL"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "BLOB"
    return "TEXT"


def chain(segments: list[tuple[int, int, str]], have: int) -> list[tuple[int, int, str]]:
    """The segments to read, in order, to extend rows ``1..have`` as far as they go: from the files that
    start at or before ``have``, the one that reaches furthest, and so on (a merged segment and the
    small ones it replaces may both be listed; a gap stops the chain until its file arrives)."""
    out: list[tuple[int, int, str]] = []
    while True:
        nxt = max((s for s in segments if s[0] <= have < s[1]), key=lambda s: s[1], default=None)
        if nxt is None:
            return out
        out.append(nxt)
        have = nxt[1]


class SegmentCache:
    """A private SQLite database holding one rank's published rows, extended as new segments arrive.

    Rows keep their rowids, so a reader's cursor (last rowid seen) means the same row here as in the
    rank's own database; the roll-ups and columnar chunks are built as the rows come in, by the
    writer's own code, so the queries on a published run answer as on a local one."""

    def __init__(self, path: Path, report: Callable[[str], None]) -> None:
        from gpudash.store.tables import TableWriter, connect

        self.path = path
        self._report = report
        self.conn = connect(path)
        self._tables = TableWriter(self.conn, lambda *a, **k: None)
        self.have: dict[str, int] = {t: self._max_rowid(t) for t in PUBLISHED_TABLES}
        self.meta_raw: bytes | None = None

    def _max_rowid(self, table: str) -> int:
        return int(self.conn.execute(f"SELECT max(rowid) FROM {quote_ident(table)}").fetchone()[0] or 0)

    def close(self) -> None:
        self.conn.close()

    def set_meta(self, raw: bytes) -> None:
        """The rank's published meta (JSON object) replaces the cached one."""
        if raw == self.meta_raw:
            return
        try:
            meta = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            self._report(f"meta.json unreadable ({exc}); the rank's meta is not shown")
            return
        if not isinstance(meta, dict):
            self._report("meta.json is not a JSON object; the rank's meta is not shown")
            return
        # the runs list's numbers (gpudash.store.listing) are the list's: a loaded run derives its own
        rows = [(str(k)[:200], json.dumps(v, default=str)) for k, v in meta.items() if k != LISTING_KEY]
        with self.conn:
            self.conn.execute("BEGIN")
            self.conn.execute("DELETE FROM meta")
            self.conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", rows)
        self.meta_raw = raw

    def wanted(self, table: str, segments: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
        return chain(segments, self.have.get(table, 0))

    def ingest(self, table: str, data: bytes | Any, name: str, *, size: int | None = None,
               row_groups: list[int] | None = None) -> int:
        """Add the rows of one segment of ``table`` after those already here; returns rows added.

        The file is someone else's: its footer is checked before any row is decoded
        (:func:`segment_bounds`) and the rows are read in batches of :data:`BATCH_ROWS`, each one's text
        measured before it is decoded, so a Parquet bomb (millions of rows in a few kB) is named as damaged
        and never costs more than a batch of memory. ``data`` may be a file read in ranges (``size`` bytes,
        :mod:`gpudash.store.ranged`), ``row_groups`` the only row groups read of it (the rest are rows held
        already)."""
        import pyarrow as pa

        try:
            pf, _text = segment_bounds(data, name, size)
        except SegmentRefused as exc:
            self._report(f"{name}: damaged, not read ({exc}); the rows after it wait for a good copy")
            return 0
        except (pa.ArrowException, OSError, ValueError) as exc:
            self._report(f"{name}: not a readable Parquet file ({exc}); the rows after it wait for a good copy")
            return 0
        added = 0
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=row_groups, use_threads=False):
                tab = pa.Table.from_batches([decoded_batch(batch)])
                added += self._ingest_batch(table, tab)
        except SegmentRefused as exc:
            self._report(f"{name}: damaged, read up to row {added:,} ({exc}); the rows after it wait for a good copy")
            return 0
        except (pa.ArrowException, OSError, ValueError) as exc:
            self._report(f"{name}: not a readable Parquet file ({exc}); the rows after it wait for a good copy")
            return 0
        return added

    def _ingest_batch(self, table: str, tab: Any) -> int:
        import pyarrow as pa
        import pyarrow.compute as pc

        have = self.have.get(table, 0)
        # a file from anyone: rows in rowid order, and no column under a name SQLite or the reader use themselves
        tab = tab.filter(pc.greater(tab.column("_rowid"), have)).sort_by("_rowid")
        if not tab.num_rows:
            return 0
        known = table_columns(self.conn, table)
        cols = [c for c in tab.column_names if c.lower() not in _NOT_COLUMNS]
        new = [(c, _sql_type(tab.schema.field(c).type)) for c in cols if c not in known]
        refused = add_columns(self.conn, table, new) if new else {}
        cols = [c for c in cols if c not in refused]
        rowids = tab.column("_rowid").to_pylist()
        data_cols = [tab.column(c).to_pylist() for c in cols]
        quoted = ", ".join(["rowid", *map(quote_ident, cols)])
        marks = ", ".join("?" * (len(cols) + 1))
        tw = self._tables
        tw.begin()
        try:
            self.conn.execute("BEGIN")
            self.conn.executemany(f"INSERT OR IGNORE INTO {quote_ident(table)} ({quoted}) VALUES ({marks})",
                                  zip(rowids, *data_cols, strict=True))
            if table in NUMERIC_TABLES:
                numeric = [c for c in cols if _sql_type(tab.schema.field(c).type) in ("REAL", "INTEGER")]
                if numeric:
                    arr = np.column_stack([pc.cast(tab.column(c), pa.float64()).to_numpy(zero_copy_only=False)
                                           for c in numeric])
                    if int(rowids[0]) == have + 1 and int(rowids[-1]) == have + len(rowids):
                        tw.chunks.append(table, have + 1, numeric, arr)
                    if table in ROLLUP_TABLES:
                        tw.rollups.update(table, numeric, arr)
                        tw.rollups.write()
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            tw.rollback()
            raise
        self.have[table] = int(rowids[-1])
        return len(rowids)


# ---- bounds on a segment from someone else ---------------------------------------------------------
#: Rows a segment may hold per byte of its file (gpudash's own hold 2-40 bytes a row: a time and a step
#: at least), plus one batch: a file claiming more is a bomb (10 million rows in 213 kB), not a record.
ROWS_PER_BYTE = 8
#: Bytes of text and binary cells one batch of a segment may decode to (measured before decoding).
BATCH_TEXT_BYTES = 256 << 20
#: Bytes the rows of a segment may take uncompressed, as its footer states them (a segment gpudash
#: writes is a few MB; a merged one of a long run a few hundred).
DECODED_BYTES = 2 << 30
#: Columns a segment may have (the reader stores at most 2,000 a table).
MAX_SEGMENT_COLUMNS = 2000
#: The encodings gpudash's writer (pyarrow's defaults) uses; a segment with another is not gpudash's.
_ENCODINGS = frozenset({"PLAIN", "PLAIN_DICTIONARY", "RLE_DICTIONARY", "RLE", "BIT_PACKED"})


class SegmentRefused(ValueError):
    """A segment whose footer or content breaks a bound (:func:`segment_bounds`): damaged, not read."""


def segment_bounds(data: bytes | Any, name: str, size: int | None = None) -> tuple[Any, list[str]]:
    """The opened :class:`pyarrow.parquet.ParquetFile` of a segment whose footer passes every bound, and its
    text/binary columns (read as dictionaries, measured per batch before decoding). Raises
    :class:`SegmentRefused` naming the bound broken: more rows than its name's rowid range or its size
    allow (:data:`ROWS_PER_BYTE`), more decoded bytes than :data:`DECODED_BYTES`, an encoding gpudash never
    writes, too many columns, no integer ``_rowid``.

    ``data``: the file's bytes, or a seekable file of ``size`` bytes read in ranges (:mod:`gpudash.store.ranged`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if isinstance(data, (bytes, bytearray, memoryview)):
        size = len(data)
        data = io.BytesIO(data)
    size = int(size or 0)
    pf = pq.ParquetFile(data)  # the footer only: no row is decoded yet
    md = pf.metadata
    rows, span = int(md.num_rows), parse_segment(name)
    if span is not None and rows > span[1] - span[0]:
        raise SegmentRefused(f"it holds {rows:,} rows, more than the {span[1] - span[0]:,} its name's rowid range "
                             f"({span[0]}, {span[1]}] allows")
    most = ROWS_PER_BYTE * size + BATCH_ROWS
    if rows > most:
        raise SegmentRefused(f"it claims {rows:,} rows in {size:,} bytes, more than the {most:,} a file of "
                             "that size holds (a Parquet bomb)")
    if md.num_columns > MAX_SEGMENT_COLUMNS:
        raise SegmentRefused(f"{md.num_columns:,} columns, over the {MAX_SEGMENT_COLUMNS:,} a table holds")
    counted, decoded = 0, 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        counted += int(rg.num_rows)
        decoded += max(int(rg.total_byte_size), 0)
        for c in range(rg.num_columns):
            col = rg.column(c)
            odd = set(col.encodings) - _ENCODINGS
            if odd:
                raise SegmentRefused(f"column {col.path_in_schema[:100]!r} is encoded {', '.join(sorted(odd))}, "
                                     "which gpudash never writes")
    if counted != rows:
        raise SegmentRefused(f"its row groups hold {counted:,} rows, its footer says {rows:,}")
    if decoded > DECODED_BYTES:
        raise SegmentRefused(f"its rows take {decoded:,} bytes decoded, over the {DECODED_BYTES:,} read at most")
    schema = pf.schema_arrow
    if "_rowid" not in schema.names or not pa.types.is_integer(schema.field("_rowid").type):
        raise SegmentRefused("no integer _rowid column; not a gpudash segment")
    text = [f.name for f in schema if _is_text(f.type)
            or (pa.types.is_dictionary(f.type) and _is_text(f.type.value_type))]
    if text:  # reopened reading text as dictionaries: each distinct value once, measured before it is spread
        data.seek(0)
        pf = pq.ParquetFile(data, read_dictionary=text)
    return pf, text


def _is_text(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                or pa.types.is_large_binary(t))


def decoded_batch(batch: Any) -> Any:
    """``batch`` with its dictionary-read text columns made plain, after checking the bytes that makes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    arrays = []
    for arr in batch.columns:
        if pa.types.is_dictionary(arr.type):  # every text column is read as one (and a file may store others so)
            if _is_text(arr.type.value_type):
                lengths = pc.binary_length(arr.dictionary)
                total += int(pc.sum(pc.take(lengths, arr.indices)).as_py() or 0)
                if total > BATCH_TEXT_BYTES:
                    raise SegmentRefused(f"its text in {BATCH_ROWS:,} rows is over {BATCH_TEXT_BYTES:,} bytes "
                                         "decoded")
            arr = arr.cast(arr.type.value_type)
        elif _is_text(arr.type):  # read plain: its bytes are what the file held uncompressed (bounded above)
            total += arr.nbytes
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)
