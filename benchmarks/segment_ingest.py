"""Cost of the bounds on reading a published segment (issue 44): the footer checks and batch-by-batch
reading of :meth:`SegmentCache.ingest` against reading the whole file at once (what it did before), on
the same segment in the same process.

    .venv/bin/python benchmarks/segment_ingest.py [--rows 300000] [--repeat 3]

The segment is a ``steps`` table as gpudash exports it (step, time, duration_s, loss, tokens, a phase;
zstd, 65,536-row groups) plus an ``events`` segment of short texts. Columns: seconds to ingest into a fresh
cache (best of ``--repeat``) each way, and their ratio (bounded / whole). The memory bound itself is held by
``tests/hostile/test_parquet_bombs.py``.
"""

from __future__ import annotations

import argparse
import io
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpudash.store.segments import BATCH_ROWS, SegmentCache


def _segment(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=BATCH_ROWS)
    return buf.getvalue()


def _steps(n: int) -> bytes:
    rng = np.random.default_rng(0)
    i = np.arange(n)
    return _segment(pa.table({"_rowid": i + 1, "step": i, "time": 1e9 + i * 0.2, "duration_s": rng.random(n),
                              "loss": rng.random(n), "tokens": np.full(n, 4096.0), "forward_s": rng.random(n)}))


def _events(n: int) -> bytes:
    i = np.arange(n)
    return _segment(pa.table({"_rowid": i + 1, "time": 1e9 + i, "step": i, "kind": ["note"] * n,
                              "message": [f"event {k} of the run" for k in range(n)]}))


def _ingest(table: str, data: bytes, name: str, whole: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cache = SegmentCache(Path(tmp) / "rank0.db", lambda msg: None)
        t0 = time.perf_counter()
        if whole:  # before the bounds: the whole file decoded at once, then stored
            cache._ingest_batch(table, pq.read_table(io.BytesIO(data)))
        else:
            cache.ingest(table, data, name)
        dt = time.perf_counter() - t0
        rows = cache.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        cache.close()
        assert rows, "nothing ingested"
        return dt


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}, "
          f"pyarrow {pa.__version__}, sqlite {sqlite3.sqlite_version}, {time.strftime('%Y-%m-%d')}")
    print("| segment | rows | file | whole file (s) | bounded (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for table, data in (("steps", _steps(args.rows)), ("events", _events(args.rows // 10))):
        n = pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
        name = f"segments/rank=0/{table}/000000000000-{n:012d}.parquet"
        whole = min(_ingest(table, data, name, True) for _ in range(args.repeat))
        bounded = min(_ingest(table, data, name, False) for _ in range(args.repeat))
        print(f"| {table} | {n:,} | {len(data) / 1e6:.1f} MB | {whole:.3f} | {bounded:.3f} | {bounded / whole:.2f} |")


if __name__ == "__main__":
    main()
