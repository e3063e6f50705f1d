"""A snapshot summary as stored bytes, and back, bounded by what the summary says it holds.

Format ``gpudash-memmap-v2`` (written since trace entries are all kept): ``GDMM2`` and a 4-byte header
length, the zlib'd JSON header (format, segments, string tables, counts, settings, and the name, dtype and
compressed length of every column), then each column of the blocks and the trace as zlib'd little-endian
numpy bytes. Reading inflates each column to exactly ``rows x itemsize`` bytes (one more is an error),
with ``rows`` within :data:`~gpudash.store.snapshot_read.MAX_BLOCKS` and
:data:`~gpudash.store.snapshot_read.MAX_TRACE`, and the header to at most :data:`MAX_HEADER_BYTES` with
at most :data:`MAX_CONTAINERS` lists and objects in it, counted before it is parsed: a crafted run
database cannot make a zlib or JSON bomb of a summary.

Format ``gpudash-memmap-v1`` (older runs): zlib'd JSON of the whole summary, read within
:data:`MAX_V1_BYTES` (the largest a v1 summary of 200,000 blocks and 100,000 trace entries can be is far
smaller) and the same container count.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from gpudash.errors import RunError
from gpudash.store.schema import TABLE_BASE_COLUMNS, quote_ident
from gpudash.store.snapshot_read import MAX_BLOCKS, MAX_TRACE, SUMMARY_FORMAT, SUMMARY_FORMAT_V1
from gpudash.units import human_bytes

__all__ = ["MAGIC", "append_snapshot_row", "MAX_CONTAINERS", "MAX_HEADER_BYTES", "MAX_V1_BYTES", "decode_summary", "encode_summary", "snapshot_row"]

MAGIC = b"GDMM2"
#: Largest inflated header (segments, frame and stack tables, settings).
MAX_HEADER_BYTES = 32 * 2**20
#: Largest inflated v1 (JSON) summary.
MAX_V1_BYTES = 96 * 2**20
#: Lists and objects in a header or a v1 summary (an honest one has a few per segment and stack): a
#: few megabytes of ``[[],[],...]`` would make hundreds of megabytes of lists.
MAX_CONTAINERS = 2_000_000
_DTYPES: dict[str, np.dtype[Any]] = {"i4": np.dtype("<i4"), "i8": np.dtype("<i8")}
_TABLES = ("blocks", "trace")


def encode_summary(summary: dict[str, Any]) -> bytes:
    """Stored bytes of a summary from :func:`~gpudash.store.snapshot_read.summarize` (v2; a v1 dict as v1)."""
    if summary.get("format") == SUMMARY_FORMAT_V1:
        return zlib.compress(json.dumps(summary, separators=(",", ":")).encode(), 6)
    header = {k: v for k, v in summary.items() if k not in _TABLES}
    columns: list[list[Any]] = []
    body: list[bytes] = []
    for table in _TABLES:
        cols = summary.get(table)
        header[f"{table}_rows"] = None if cols is None else (len(next(iter(cols.values()))) if cols else 0)
        for name, arr in (cols or {}).items():
            a = np.asarray(arr)
            code = "i4" if a.dtype.itemsize <= 4 else "i8"
            data = zlib.compress(np.ascontiguousarray(a, dtype=_DTYPES[code]).tobytes(), 1)
            columns.append([table, name, code, len(data)])
            body.append(data)
    header["columns"] = columns
    head = zlib.compress(json.dumps(header, separators=(",", ":")).encode(), 6)
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, *body])


def snapshot_row(summary: dict[str, Any], *, time: float, step: int | None, reason: str) -> dict[str, Any]:
    """The ``snapshots`` table row for a summary."""
    return {"time": time, "step": step, "reason": reason, "format": SUMMARY_FORMAT,
            "data": encode_summary(summary)}


def _inflate(data: bytes | memoryview, limit: int, what: str, exact: int | None = None) -> bytes:
    """``data`` inflated, refusing past ``limit`` bytes (or anything but ``exact`` bytes)."""
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"{what}: damaged compressed data ({exc})") from None
    if len(raw) > limit or inflater.unconsumed_tail:
        raise ValueError(f"{what} inflates to over {human_bytes(limit, 0)}, more than it says it holds "
                         "(a crafted or damaged run database)")
    if not inflater.eof:
        raise ValueError(f"{what} is cut short (truncated zlib data)")
    if exact is not None and len(raw) != exact:
        raise ValueError(f"{what} holds {len(raw):,} bytes where its rows need {exact:,}")
    return raw


def _json(raw: bytes, what: str) -> Any:
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > MAX_CONTAINERS:
        raise ValueError(f"{what} holds over {MAX_CONTAINERS:,} lists and objects (counted before parsing; "
                         "no gpudash summary has that many: a crafted run database)")
    return json.loads(raw.decode())


def decode_summary(data: bytes, max_bytes: int | None = None) -> dict[str, Any]:
    """Stored bytes back to a summary dict; ValueError, naming why, if they are not one or hold more than
    they say (``max_bytes``: the v1 limit, default :data:`MAX_V1_BYTES`)."""
    view = memoryview(data)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        out = _json(_inflate(view, MAX_V1_BYTES if max_bytes is None else max_bytes, "snapshot summary"),
                    "snapshot summary")
        if not isinstance(out, dict) or out.get("format") != SUMMARY_FORMAT_V1:
            raise ValueError("not a gpudash memory-map summary")
        return out
    if len(view) < len(MAGIC) + 4:
        raise ValueError("snapshot summary is cut short (no header)")
    (head_len,) = struct.unpack_from("<I", view, len(MAGIC))
    at = len(MAGIC) + 4
    header = _json(_inflate(view[at:at + head_len], MAX_HEADER_BYTES, "snapshot summary header"),
                   "snapshot summary header")
    at += head_len
    if not isinstance(header, dict) or header.get("format") != SUMMARY_FORMAT:
        raise ValueError("not a gpudash memory-map summary")
    limits = {"blocks": MAX_BLOCKS, "trace": MAX_TRACE}
    rows: dict[str, int | None] = {}
    for table in _TABLES:
        n = header.get(f"{table}_rows")
        if n is not None and (not isinstance(n, int) or not 0 <= n <= limits[table]):
            raise ValueError(f"snapshot summary says it holds {n!r} {table} rows (at most {limits[table]:,})")
        rows[table] = n
    out = {k: v for k, v in header.items() if k not in ("columns", "blocks_rows", "trace_rows")}
    for table in _TABLES:
        out[table] = None if rows[table] is None else {}
    columns = header.get("columns")
    if not isinstance(columns, list) or len(columns) > 64:
        raise ValueError("snapshot summary has no column list")
    for col in columns:
        if not (isinstance(col, list) and len(col) == 4 and col[0] in _TABLES and isinstance(col[1], str)
                and col[2] in _DTYPES and isinstance(col[3], int) and col[3] >= 0):
            raise ValueError(f"snapshot summary: bad column entry {str(col)[:80]}")
        table, name, code, size = col
        n = rows[table]
        if n is None:
            raise ValueError(f"snapshot summary: a {table} column but no {table} rows")
        if at + size > len(view):
            raise ValueError(f"snapshot summary is cut short (column {table}.{name})")
        dtype = _DTYPES[code]
        raw = _inflate(view[at:at + size], n * dtype.itemsize, f"snapshot column {table}.{name}",
                       exact=n * dtype.itemsize)
        at += size
        out[table][name] = np.frombuffer(raw, dtype=dtype)
    return out


def append_snapshot_row(db: Path, row: dict[str, object]) -> None:
    """Add one snapshot row to a rank database (an existing, maybe live, run: its meta is left alone)."""
    cols = [c for c, _ in TABLE_BASE_COLUMNS["snapshots"]]
    body = ", ".join(f"{quote_ident(c)} {t}" for c, t in TABLE_BASE_COLUMNS["snapshots"])
    try:
        conn = sqlite3.connect(db, timeout=30)
        try:
            with conn:
                conn.execute(f"CREATE TABLE IF NOT EXISTS snapshots ({body})")
                conn.execute(f"INSERT INTO snapshots ({', '.join(map(quote_ident, cols))}) "
                             f"VALUES ({', '.join('?' * len(cols))})",
                             [row[c] for c in cols])
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise RunError(f"{db}: cannot add the snapshot ({exc}); is it a gpudash run database?") from None
