"""No link followed below a run folder (issue 44, item 2): a ``meta.json``, a segment, a folder of
segments, a rank file linked elsewhere is named and never read, on every reader (the run, ``/metrics``);
``snapshot.request`` is never written through a link."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from helpers.hostile_cases import healthy
from prometheus_client import generate_latest

from gpudash.server.layouts.pages import request_snapshot
from gpudash.server.metrics import metrics_registry
from gpudash.server.runcache import shared_cache
from gpudash.store import load_run
from gpudash.store.bounded import UnsafeFile
from gpudash.store.segments import PUBLISHED_TABLES, export_rows, read_meta_rows

SECRET = "aws_secret_access_key_LEAKED"


def published(run: Path, n: int = 30, loss: float | None = None) -> Path:
    """A run as a shared folder holds it: its rows as Parquet segments and the rank's meta.json."""
    healthy(run, n)
    if loss is not None:
        with sqlite3.connect(run / "rank0.db") as c:
            c.execute("UPDATE steps SET loss = ?", (loss,))
    rank = run / "segments" / "rank=0"
    with sqlite3.connect(run / "rank0.db") as c:
        for table in PUBLISHED_TABLES:
            (rank / table).mkdir(parents=True)
            last = c.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()[0]
            if last:
                export_rows(c, table, 0, out=rank / table / f"{0:012d}-{last:012d}.parquet")
        (rank / "meta.json").write_text(json.dumps(read_meta_rows(c)))
    c.close()
    for p in run.glob("rank0.db*"):
        p.unlink()
    return run


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    shared_cache().clear()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "credentials.json").write_text(json.dumps({"name": SECRET, "host": SECRET}))
    published(tmp_path / "outside" / "other", loss=99.5)
    published(tmp_path / "runs" / "good")
    return tmp_path


def _problems(run: Path) -> tuple[list[str], object]:
    r = load_run(run)
    try:
        return list(r.problems), r
    finally:
        r.close()


def test_a_linked_meta_json_is_not_read(runs: Path) -> None:
    run = published(runs / "runs" / "bad")
    meta = run / "segments" / "rank=0" / "meta.json"
    meta.unlink()
    meta.symlink_to(runs / "outside" / "credentials.json")
    r = load_run(run)
    try:
        assert SECRET not in json.dumps(r.meta, default=str)
        assert [p for p in r.problems if "meta.json" in p and "symbolic link" in p], r.problems
        assert len(r.steps) == 30, "\n".join(r.problems)  # the rows are still read
    finally:
        r.close()


def test_a_linked_segment_is_not_read_nor_scraped(runs: Path) -> None:
    run = published(runs / "runs" / "bad", n=10)
    steps = run / "segments" / "rank=0" / "steps"
    theirs = next((runs / "outside" / "other" / "segments" / "rank=0" / "steps").iterdir())
    (steps / "000000000010-000000000040.parquet").symlink_to(theirs)  # rows 11..40 "published" elsewhere
    r = load_run(run)
    try:
        assert len(r.steps) == 10 and 99.5 not in set(r.steps["loss"])
        assert [p for p in r.problems if "000000000010-000000000040.parquet" in p and "symbolic link" in p]
    finally:
        r.close()
    text = generate_latest(metrics_registry(runs / "runs", facts=False)).decode()
    assert 'run="bad"' in text and "99.5" not in text and 'gpudash_run_damaged{' in text


def test_a_linked_folder_below_segments_is_not_entered(runs: Path) -> None:
    run = published(runs / "runs" / "bad", n=10)
    rank1 = run / "segments" / "rank=1"
    rank1.symlink_to(runs / "outside" / "other" / "segments" / "rank=0", target_is_directory=True)
    other = runs / "runs" / "bad2"
    published(other, n=10)
    steps = other / "segments" / "rank=0" / "steps"
    for p in steps.iterdir():
        p.unlink()
    steps.rmdir()
    steps.symlink_to(runs / "outside" / "other" / "segments" / "rank=0" / "steps", target_is_directory=True)
    whole = runs / "runs" / "bad3"
    published(whole, n=10)
    (whole / "segments").rename(runs / "outside" / "moved")
    (whole / "segments").symlink_to(runs / "outside" / "other" / "segments", target_is_directory=True)
    for path, link in ((run, "segments/rank=1"), (other, "segments/rank=0/steps"), (whole, "segments")):
        r = load_run(path)
        try:
            assert 99.5 not in set(r.steps.get("loss", [])) and SECRET not in json.dumps(r.meta, default=str)
            assert set(r.steps["rank"]) == {0} if path == run else r.steps.empty
            assert [p for p in r.problems if p.startswith(f"{link}: a symbolic link")], (link, r.problems)
        finally:
            r.close()


def test_a_linked_rank_file_is_not_read(runs: Path) -> None:
    run = healthy(runs / "runs" / "bad")
    (run / "rank1.db").symlink_to(healthy(runs / "outside" / "db")/"rank0.db")  # inside or out: never followed
    problems, _ = _problems(run)
    assert [p for p in problems if "rank1.db" in p and "symbolic link" in p], problems


def test_snapshot_request_is_never_written_through_a_link(runs: Path) -> None:
    run = healthy(runs / "runs" / "live")
    victim = healthy(runs / "runs" / "victim") / "rank0.db"
    before = victim.read_bytes()
    (run / "snapshot.request").symlink_to(victim)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        request_snapshot(run)
    assert victim.read_bytes() == before
    (run / "snapshot.request").unlink()
    assert request_snapshot(run).read_text().strip()  # an ordinary request is written


def test_open_below_refuses_a_link_at_every_level(tmp_path: Path) -> None:
    from gpudash.store.bounded import open_below, read_below

    (tmp_path / "real" / "a").mkdir(parents=True)
    (tmp_path / "real" / "a" / "f").write_bytes(b"x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a").symlink_to(tmp_path / "real" / "a", target_is_directory=True)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        read_below(tmp_path / "run", "a/f", 10)
    os.symlink(tmp_path / "real" / "a" / "f", tmp_path / "run" / "f")
    with pytest.raises(UnsafeFile, match="symbolic link"):
        read_below(tmp_path / "run", "f", 10)
    with pytest.raises(UnsafeFile):
        open_below(tmp_path / "run", "../real/a/f")
    assert read_below(tmp_path / "real", "a/f", 10) == b"x"
