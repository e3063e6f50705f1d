"""Reading one run in a bucket (issue 45), against moto's S3 server: what opening a run, a few of its columns and a
live reader's new rows cost in bytes fetched and seconds, and how the bounded segment cache holds its limit.

    .venv/bin/python benchmarks/bucket_read.py                 # --rows 200000 --scalars 16
    .venv/bin/python benchmarks/bucket_read.py --write         # also update benchmarks/RESULTS.md

A ``steps`` segment as gpudash's writer exports it (zstd, 65,536-row groups; step, time, duration_s and
``--scalars`` logged values) is put in the bucket. Measured, each in the same process, bytes counted at the
filesystem (every ``cat_file``, whole or ranged):

- the whole segment fetched (what opening a run does: every column is cached for the pages and roll-ups);
- two columns read in ranges (:func:`gpudash.store.ranged.read_published`), against the peer pyarrow
  ``pq.read_table(..., filesystem=s3fs, columns=...)``, and DuckDB's ``read_parquet`` over the bucket
  (:mod:`gpudash.store.duck`);
- a live reader's new rows: the last 10,000 rows after its cursor, and a merged segment over rows it already
  holds (only the row groups past them fetched);
- the segment cache bounded with ``--cache-mb``: ``--open`` runs of ``--small-rows`` rows opened in turn, the
  largest local cache seen against the limit.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import results  # noqa: E402  benchmarks/results.py, next to this script

SECTION = "## Reading a run in a bucket: ranged reads and the bounded cache (issue 45)"


def _segment(rows: int, scalars: int) -> bytes:
    """A steps segment exported by gpudash's own writer code from a SQLite table."""
    import numpy as np

    from gpudash.store.segments import export_rows

    rng = np.random.default_rng(0)
    conn = sqlite3.connect(":memory:")
    cols = ["step INTEGER", "time REAL", "duration_s REAL", *(f"m{i} REAL" for i in range(scalars))]
    conn.execute(f"CREATE TABLE steps ({', '.join(cols)})")
    data = np.column_stack([np.arange(rows), 1e9 + np.arange(rows) * 0.2, rng.random(rows),
                            *(np.cumsum(rng.normal(size=rows)) for _ in range(scalars))])
    marks = ", ".join("?" * data.shape[1])
    conn.executemany(f"INSERT INTO steps VALUES ({marks})",
                     ([int(r[0]), *map(float, r[1:])] for r in data))
    out, last = export_rows(conn, "steps", 0)
    assert out is not None and last == rows
    return out


def _counter(fs: Any) -> list[int]:
    seen: list[int] = []
    real = fs.cat_file

    def cat_file(path: str, *a: Any, **k: Any) -> Any:
        data = real(path, *a, **k)
        seen.append(len(data))
        return data

    fs.cat_file = cat_file
    return seen


def _timed(fn: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--scalars", type=int, default=16)
    p.add_argument("--small-rows", type=int, default=20_000)
    p.add_argument("--open", type=int, default=6)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    os.environ["GPUDASH_LOCAL_DIR"] = tempfile.mkdtemp(prefix="bench-read-")

    import json
    import logging

    import pyarrow.parquet as pq
    from bucket_runs import start_moto

    from gpudash.store import localdisk, mirror
    from gpudash.store.duck import connect, segments_glob
    from gpudash.store.objstore import open_store
    from gpudash.store.ranged import read_published
    from gpudash.store.reader import RunReader
    from gpudash.store.runsync import RunsMirror

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server: one log line a request otherwise
    server, _endpoint = start_moto()
    try:
        store = open_store("s3://bench/wide")
        store.fs.mkdir("bench")
        whole = _segment(args.rows, args.scalars)
        name = f"segments/rank=0/steps/000000000000-{args.rows:012d}.parquet"
        store.put(name, whole)
        seen = _counter(store.fs)
        rows: list[tuple[str, int, int, float]] = []  # what, bytes, requests, seconds

        def measure(what: str, fn: Any) -> Any:
            seen.clear()
            out, dt = _timed(fn)
            rows.append((what, sum(seen), len(seen), dt))
            return out

        measure("whole segment (what opening a run fetches)", lambda: store.get(name))
        cols = ["step", "m0"]
        tab = measure("2 columns, ranged (gpudash read_published)", lambda: read_published(store, "steps", cols))
        assert tab.num_rows == args.rows
        full = f"{store.root}/{name}"
        _peer, peer_s = _timed(lambda: pq.read_table(full, filesystem=store.fs, columns=["_rowid", *cols]))
        con = connect("s3://bench/wide")
        q = f"SELECT count(*), avg(m0) FROM read_parquet('{segments_glob('s3://bench/wide', 'steps')}')"
        (n_duck, _avg), duck_s = _timed(lambda: con.execute(q).fetchall()[0])
        assert n_duck == args.rows
        tail = measure("last 10,000 rows after a cursor, 2 columns",
                       lambda: read_published(store, "steps", cols, after=args.rows - 10_000))
        assert tail.num_rows == 10_000

        # a live reader holding all but the last 10,000 rows meets the merged segment
        live = open_store("s3://bench/live")
        first_rows = args.rows - 10_000
        part = pq.read_table(io.BytesIO(whole)).slice(0, first_rows)
        buf = io.BytesIO()
        pq.write_table(part, buf, compression="zstd", row_group_size=65_536)
        live.put(f"segments/rank=0/steps/000000000000-{first_rows:012d}.parquet", buf.getvalue())
        reader = RunReader("s3://bench/live")
        live.put(name, whole)
        live.remove(f"segments/rank=0/steps/000000000000-{first_rows:012d}.parquet")
        live_seen = _counter(live.fs)
        live_seen.clear()
        _r, live_s = _timed(reader.refresh)
        assert reader.ranks[0].max_rowid("steps") == args.rows
        rows.append(("live reader: merged segment over rows held (new row groups only)", sum(live_seen),
                     len(live_seen), live_s))
        reader.close()

        # the bounded cache: --open runs opened in turn, the limit holding about two
        small = _segment(args.small_rows, args.scalars)
        team = open_store("s3://bench/team")
        for i in range(args.open):
            team.put(f"r{i}/run.json", json.dumps({"name": f"r{i}", "created_at": 1e9 + i}).encode())
            team.put(f"r{i}/segments/rank=0/meta.json", json.dumps({"status": "finished", "segments": True}).encode())
            team.put(f"r{i}/segments/rank=0/steps/000000000000-{args.small_rows:012d}.parquet", small)
        listing = RunsMirror("s3://bench/team", Path(tempfile.mkdtemp(prefix="bench-list-")))
        listing.sync_once()
        mirror.IN_USE_S = 0.0  # each run left as the next opens (a user clicking through the list)
        first, open_s = _timed(lambda: RunReader(listing.local / "r0"))
        one = mirror.cache_bytes()
        first.close()
        limit = int(one * 2.5)
        localdisk.set_cache_limit(limit)
        most, held = one, 1
        for i in range(1, args.open):
            r = RunReader(listing.local / f"r{i}")
            most = max(most, mirror.cache_bytes())
            held = len(mirror.open_mirrors())
            r.close()
        server_note = (f"{args.open} runs of {args.small_rows:,} rows opened in turn with a limit of "
                       f"{limit / 1e6:.1f} MB (one run's cache {one / 1e6:.1f} MB, opened in {open_s:.2f} s): "
                       f"largest local cache seen {most / 1e6:.1f} MB, {held} runs held at the end")
    finally:
        server.stop()

    lines = [SECTION, "",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; date "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f} at the end "
             "(a shared machine).",
             f"Command: `.venv/bin/python benchmarks/bucket_read.py --rows {args.rows} --scalars {args.scalars}` "
             f"(moto's S3 server in the same process; a steps segment of {args.rows:,} rows, "
             f"{3 + args.scalars} columns, {len(whole) / 1e6:.1f} MB, 65,536-row groups).", "",
             "| read | bytes fetched | requests | seconds | bytes vs whole |", "|---|---:|---:|---:|---:|"]
    for what, nbytes, reqs, secs in rows:
        lines.append(f"| {what} | {nbytes / 1e6:.2f} MB | {reqs} | {secs:.2f} | {nbytes / len(whole):.2f} |")
    ranged_s = rows[1][3]
    lines += ["", f"Peers on the same 2 columns: pyarrow `pq.read_table(filesystem=s3fs, columns=...)` {peer_s:.2f} s "
              f"(gpudash's ranged read {ranged_s:.2f} s, ratio {ranged_s / peer_s:.2f}); DuckDB `read_parquet` on the "
              f"bucket (fsspec registered, `count(*)`, `avg(m0)`) {duck_s:.2f} s.", "", f"Bounded cache: {server_note}."]
    text = "\n".join(lines)
    print(text)
    if args.write:
        results.write_section(SECTION, text)


if __name__ == "__main__":
    main()
