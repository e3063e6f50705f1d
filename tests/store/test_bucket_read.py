"""Reading runs in an object store (issue 45): the opened runs' fetched segments bounded in bytes on local disk
(least recently read run dropped, never one open now), ranged reads of a few columns or of a merged segment's new
rows, snapshots of a run in a bucket, MinIO-style endpoints, DuckDB on the bucket."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="object-store tests need s3fs (pip install 'gpudash[s3]')")
pytest.importorskip("moto.server", reason="object-store tests need moto[server] (dev extra)")

from helpers.s3 import bucket as _bucket
from helpers.s3 import copy_run, forget_served, record_run

from gpudash import load_run
from gpudash.errors import UserError
from gpudash.server.layouts import runs as page
from gpudash.server.runcache import shared_cache
from gpudash.store import localdisk
from gpudash.store import mirror as mirror_mod
from gpudash.store.objstore import ENDPOINT_ENV, open_store
from gpudash.store.ranged import read_published
from gpudash.store.reader import RunReader
from gpudash.store.runsync import RunsMirror, open_mirrors


def _counted(fs: object, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(path, bytes) of every read through the store's filesystem, whole or ranged."""
    seen: list[tuple[str, int]] = []
    real = fs.cat_file  # type: ignore[attr-defined]

    def cat_file(path: str, *a: object, **k: object) -> object:
        data = real(path, *a, **k)
        seen.append((str(path), len(data)))  # type: ignore[arg-type]
        return data

    monkeypatch.setattr(fs, "cat_file", cat_file)
    return seen


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    forget_served()
    yield
    forget_served()
    localdisk.set_cache_limit(None)


def _three_runs(tmp_path: Path) -> RunsMirror:
    _bucket("runs")
    record_run("s3://runs/team/a", 20)
    copy_run("s3://runs/team/a", "s3://runs/team/b")
    copy_run("s3://runs/team/a", "s3://runs/team/c")
    mirror = RunsMirror("s3://runs/team", tmp_path / "local")
    mirror.sync_once()
    return mirror


def test_the_segment_cache_is_bounded_in_bytes_and_never_drops_a_run_open_now(
        s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = _three_runs(tmp_path)
    a = RunReader(mirror.local / "a")
    one = mirror_mod.cache_bytes()
    assert one > 0 and [m.store.location for m in open_mirrors()] == ["s3://runs/team/a"]
    localdisk.set_cache_limit(int(one * 1.5))  # room for one run, not two
    monkeypatch.setattr(mirror_mod, "IN_USE_S", 1e9)  # every run read is open now: none is dropped
    b = RunReader(mirror.local / "b")
    assert {m.store.location for m in open_mirrors()} == {"s3://runs/team/a", "s3://runs/team/b"}
    assert not [p for p in a.all_problems() + b.all_problems() if "cache" in p]  # each fits alone: no note

    monkeypatch.setattr(mirror_mod, "IN_USE_S", 0.0)  # now neither is read: the least recently read go first
    c = RunReader(mirror.local / "c")
    assert [m.store.location for m in open_mirrors()] == ["s3://runs/team/c"]
    assert mirror_mod.cache_bytes() <= int(one * 1.5)
    try:
        assert c.read_table("steps")["step"].tolist() == list(range(20))
        a.refresh()  # its segments were dropped: fetched again on its next read, the rows the same
        assert a.read_table("steps")["step"].tolist() == list(range(20))
        assert "s3://runs/team/a" in {m.store.location for m in open_mirrors()}
    finally:
        for r in (a, b, c):
            r.close()


def test_a_run_larger_than_the_cache_is_said_in_one_line_not_a_crash(s3: str, tmp_path: Path) -> None:
    mirror = _three_runs(tmp_path)
    localdisk.set_cache_limit(1)
    run = load_run(mirror.local / "a")
    try:
        said = [p for p in run.problems if "segment cache is full" in p]
        assert len(said) == 1 and "--cache-mb" in said[0] and "\n" not in said[0], run.problems
        assert len(run.steps) < 20  # the rows that fitted, nothing more fetched
    finally:
        run.close()
    summary = page.run_summary("a", mirror.local / "a")  # the runs page: the same line, no error
    assert [p for p in summary["problems"] if "segment cache is full" in p], summary


def test_serve_cache_mb_flag_takes_a_positive_number_or_says_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudash.commands import serve

    serve._cache_limit("64")
    assert localdisk.cache_limit() == 64 << 20
    for bad in ("0", "-3", "lots", "nan"):
        with pytest.raises(UserError, match=r"--cache-mb .*MB"):
            serve._cache_limit(bad)
    localdisk.set_cache_limit(None)
    monkeypatch.setenv(localdisk.CACHE_MB_ENV, "12.5")
    serve._cache_limit(None)
    assert localdisk.cache_limit() == int(12.5 * (1 << 20))


def _wide_segment(rows: int, cols: int, group: int) -> bytes:
    """A steps segment of ``rows`` rows and ``cols`` logged scalars (random: incompressible), in row groups of
    ``group`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    data = {"_rowid": pa.array(np.arange(1, rows + 1), pa.int64()), "step": pa.array(np.arange(rows), pa.int64()),
            "time": pa.array(np.arange(rows) * 0.1), "duration_s": pa.array(np.full(rows, 0.1))}
    data.update({f"m{i}": pa.array(rng.random(rows)) for i in range(cols)})
    sink = io.BytesIO()
    pq.write_table(pa.table(data), sink, compression="zstd", row_group_size=group)
    return sink.getvalue()


def test_a_few_columns_or_the_rows_after_a_cursor_are_read_in_ranges(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _bucket("runs")
    store = open_store("s3://runs/wide")
    whole = _wide_segment(20_000, 16, 5_000)
    store.put("segments/rank=0/steps/000000000000-000000020000.parquet", whole)
    reads = _counted(store.fs, monkeypatch)
    tab = read_published(store, "steps", ["step", "m3"])
    fetched = sum(n for _, n in reads)
    assert tab.column_names == ["_rowid", "step", "m3", "rank"] and tab["step"].to_pylist() == list(range(20_000))
    assert fetched < len(whole) / 4, (fetched, len(whole))  # 2 of 20 columns: the footer and those chunks only

    reads.clear()
    tail = read_published(store, "steps", ["step", "m3"], after=17_500)  # a live reader's cursor
    assert tail["step"].to_pylist() == list(range(17_500, 20_000))
    assert sum(n for _, n in reads) < fetched / 2  # only the last row group's chunks


def test_a_merged_segment_over_rows_held_fetches_only_its_new_row_groups(s3: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow.parquet as pq

    _bucket("runs")
    store = open_store("s3://runs/live")
    whole = _wide_segment(20_000, 16, 5_000)
    first = io.BytesIO()
    pq.write_table(pq.read_table(io.BytesIO(whole)).slice(0, 15_000), first, compression="zstd",
                   row_group_size=5_000)
    store.put("segments/rank=0/steps/000000000000-000000015000.parquet", first.getvalue())
    reader = RunReader("s3://runs/live")
    try:
        assert len(reader.read_table("steps")) == 15_000
        # the writer merged its segments: one file over rows 1..20000 replaces the one read
        store.put("segments/rank=0/steps/000000000000-000000020000.parquet", whole)
        store.remove("segments/rank=0/steps/000000000000-000000015000.parquet")
        reads = _counted(store.fs, monkeypatch)
        reader.refresh()
        assert reader.read_table("steps")["step"].tolist() == list(range(20_000))
        got = sum(n for p, n in reads if p.endswith(".parquet"))
        assert 0 < got < len(whole) / 2, (got, len(whole))  # the footer and the last row group, not the file
    finally:
        reader.close()


def test_snapshots_of_a_run_in_a_bucket_open_like_local_ones(s3: str, tmp_path: Path) -> None:
    from helpers.components import find
    from helpers.runmaker import train

    from gpudash.server.layouts.pages import build_run_page
    from gpudash.server.layouts.snapshot_views import load_snapshots

    _bucket("runs")
    train("s3://runs/team/snap", steps=6, rich=True, hostile=False)  # type: ignore[arg-type]
    mirror = RunsMirror("s3://runs/team", tmp_path / "local")
    mirror.sync_once()
    reader, lock = shared_cache().reader(mirror.local / "snap")
    with lock:
        maps = load_snapshots(reader)
        shown = build_run_page("snap", reader)  # the run page: its memory map drawn from the bucket's rows
    assert len(maps) == 1 and maps[0].step == 0
    assert find(shown, "segment-map") is not None and find(shown, "alloc-timeline-box") is not None
    local = train(tmp_path / "snap", steps=6, rich=True, hostile=False)
    mine = load_run(local).snapshots
    assert len(mine) == 1 and len(maps[0].segments) == len(mine[0].segments)
    assert len(maps[0].blocks) == len(mine[0].blocks)


def test_a_minio_style_endpoint_is_addressed_path_style(s3: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudash.commands import serve

    monkeypatch.delenv("AWS_ENDPOINT_URL")  # only the flag says where the server is
    monkeypatch.setenv(ENDPOINT_ENV, "unset")
    monkeypatch.delenv(ENDPOINT_ENV)  # restored (unset) after the test
    with pytest.raises(UserError, match="not a URL"):
        serve._endpoint("minio:9000")
    serve._endpoint(s3)
    store = open_store("s3://minio-bucket/runs/a")
    assert store.fs.client_kwargs["endpoint_url"] == s3
    assert store.fs.config_kwargs["s3"] == {"addressing_style": "path"}
    store.fs.mkdir("minio-bucket")
    store.put("run.json", b"{}")
    assert store.get("run.json") == b"{}"


def test_duckdb_queries_the_bucket_directly(s3: str) -> None:
    duckdb = pytest.importorskip("duckdb", reason="the README's query needs duckdb (dev extra)")
    from gpudash.store.duck import connect, segments_glob

    _bucket("runs")
    record_run("s3://runs/team/a", 12)
    con = connect("s3://runs/team/a")
    got = con.sql(f"SELECT rank, max(step), count(*) FROM read_parquet('{segments_glob('s3://runs/team/a', 'steps')}', "
                  "hive_partitioning = true, union_by_name = true) GROUP BY rank").fetchall()
    assert got == [(0, 11, 12)]
    assert isinstance(con, duckdb.DuckDBPyConnection)


def test_serve_with_a_cache_too_small_for_a_run_says_so_on_its_summary(s3: str, tmp_path: Path) -> None:
    """``gpudash serve s3://... --cache-mb`` in another process, the environment as a user has it: the run is
    listed, and opening it answers with the one line about the cache, not an error."""
    import json
    import subprocess
    import sys
    import time
    import urllib.request

    from helpers.s3 import free_port

    _bucket("runs")
    record_run("s3://runs/team/a", 20)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gpudash", "serve", "s3://runs/team", "--port", str(port),
                               "--cache-mb", "0.01"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    api = f"http://127.0.0.1:{port}/api/runs"

    def get(url: str) -> object:
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return json.loads(resp.read())
        except OSError:
            return None

    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and not ((get(api) or {}).get("runs")):  # type: ignore[attr-defined]
            time.sleep(0.3)
        summary = get(f"{api}/a/summary")
        assert isinstance(summary, dict), summary
        said = [p for p in summary["problems"] if "segment cache is full" in p]
        assert len(said) == 1 and "--cache-mb" in said[0], summary["problems"]
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert "local cache of at most 10.2 KiB" in out, out


def test_the_bound_on_open_runs_drops_one_not_open_now_first(s3: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    mirror = _three_runs(tmp_path)
    monkeypatch.setattr(mirror_mod, "OPEN_RUNS", 2)
    monkeypatch.setattr(mirror_mod, "IN_USE_S", 1e9)
    readers = [RunReader(mirror.local / "a"), RunReader(mirror.local / "b")]
    try:
        b = next(m for m in open_mirrors() if m.store.location.endswith("/b"))
        b.used_at = -1e18  # left long ago; a (opened before it) is still read
        readers.append(RunReader(mirror.local / "c"))
        assert sorted(m.store.location for m in open_mirrors()) == ["s3://runs/team/a", "s3://runs/team/c"]
    finally:
        for r in readers:
            r.close()
