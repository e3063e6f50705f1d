"""Parquet bombs (issue 44, item 3): every segment read is bounded by rows and bytes before a row is
decoded. The issue's bomb, 10 million delta-encoded rows in ~220 kB of zstd, is named as damaged by
``gpudash info`` in a process whose peak memory stays near its start (today: ~3 GB), and a segment's row
count must fit its name's rowid range and its text its decoded-bytes bound."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpudash.store import segments
from gpudash.store.segments import SegmentCache

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BOMB_ROWS = 10_000_000
BOMB_NAME = f"000000000000-{BOMB_ROWS:012d}.parquet"  # the name agrees with the rows: only the size gives it away


@pytest.fixture(scope="module")
def bomb() -> bytes:
    ids = np.arange(1, BOMB_ROWS + 1, dtype=np.int64)
    table = pa.table({"_rowid": ids, "step": ids - 1, "time": np.full(BOMB_ROWS, 1e9)})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", use_dictionary=False, row_group_size=BOMB_ROWS,
                   column_encoding={"_rowid": "DELTA_BINARY_PACKED", "step": "DELTA_BINARY_PACKED",
                                    "time": "BYTE_STREAM_SPLIT"})
    data = buf.getvalue()
    assert len(data) < 400_000  # ~220 kB: 10 million rows
    return data


def test_the_bomb_is_refused_from_its_footer(bomb: bytes, tmp_path: Path) -> None:
    from gpudash.store.segments import SegmentRefused, segment_bounds

    with pytest.raises(SegmentRefused, match="claims 10,000,000 rows in .* bytes.*Parquet bomb"):
        segment_bounds(bomb, BOMB_NAME)
    said: list[str] = []
    cache = SegmentCache(tmp_path / "rank0.db", said.append)
    try:
        assert cache.ingest("steps", bomb, f"segments/rank=0/steps/{BOMB_NAME}") == 0
        assert cache.have["steps"] == 0
    finally:
        cache.close()
    assert len(said) == 1 and "damaged, not read" in said[0] and BOMB_NAME in said[0]


def _table_bytes(n: int, **cols: object) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"_rowid": np.arange(1, n + 1, dtype=np.int64), **cols}), buf, compression="zstd")
    return buf.getvalue()


def test_rows_beyond_the_names_rowid_range_are_refused() -> None:
    from gpudash.store.segments import SegmentRefused, segment_bounds

    data = _table_bytes(100, step=np.arange(100))
    with pytest.raises(SegmentRefused, match="100 rows, more than the 10 its name's rowid range"):
        segment_bounds(data, "000000000000-000000000010.parquet")
    pf, _ = segment_bounds(data, "000000000000-000000000100.parquet")
    assert pf.metadata.num_rows == 100


def test_text_is_measured_before_it_is_decoded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One 1 MB text, referred to by 60,000 rows through the dictionary: 60 GB if decoded."""
    n = 60_000
    text = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array(["x" * 1_000_000]))
    data = _table_bytes(n, step=np.arange(n), message=text)
    assert len(data) < 1_000_000  # 60 GB of text in under a MB
    said: list[str] = []
    cache = SegmentCache(tmp_path / "rank0.db", said.append)
    try:
        assert cache.ingest("events", data, f"segments/rank=0/events/000000000000-{n:012d}.parquet") == 0
    finally:
        cache.close()
    assert len(said) == 1 and "text in 65,536 rows is over" in said[0], said
    monkeypatch.setattr(segments, "BATCH_ROWS", 100)  # small batches: a healthy file is read whole, batch by batch
    cache = SegmentCache(tmp_path / "ok.db", said.append)
    try:
        ok = _table_bytes(1000, step=np.arange(1000), kind=["note"] * 1000)
        assert cache.ingest("events", ok, "segments/rank=0/events/000000000000-000000001000.parquet") == 1000
        assert cache.conn.execute("SELECT count(*), max(rowid) FROM events").fetchone() == (1000, 1000)
    finally:
        cache.close()


# the peak is VmHWM (this process's own memory): getrusage's ru_maxrss keeps the parent's peak across exec
_PROBE = """
import sys, os
from gpudash.cli import main
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def peak():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
main(["info", sys.argv[2]])  # a healthy run first: the imports and caches any reading costs
start = rss()
rc = main(["info", sys.argv[1]])
print("RC", rc, "START", start, "PEAK", peak(), "END", rss())
"""


@pytest.mark.slow
def test_info_names_the_bomb_and_its_memory_stays_put(bomb: bytes, tmp_path: Path) -> None:
    from helpers.hostile_cases import healthy

    run = healthy(tmp_path / "bombed")
    (run / "rank0.db").unlink()
    steps = run / "segments" / "rank=0" / "steps"
    steps.mkdir(parents=True)
    (steps / BOMB_NAME).write_bytes(bomb)
    (run / "segments" / "rank=0" / "meta.json").write_text(json.dumps({"name": "bombed"}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(run), str(healthy(tmp_path / "good"))],
                         capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Parquet bomb" in out.stdout and BOMB_NAME in out.stdout and "damaged" in out.stdout
    nums = out.stdout.split("RC ", 1)[1].split()
    rc, start, peak, end = int(nums[0]), int(nums[2]), int(nums[4]), int(nums[6])
    assert rc == 0
    # generous: reading the bomb costs at most a few batches more than a healthy run, not the 10 million
    # rows (~3 GB before), and what it took is given back
    assert peak < start + (384 << 20) and peak < 1 << 30, (start, peak)
    assert end < start + (128 << 20), (start, end)
