"""The writer survives what a training loop or the machine throws at it (issue 12, items 1-3)."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

import pytest

import gpudash
from gpudash.monitor import Monitor
from gpudash.store.schema import column_name, namespaced_column
from gpudash.store.writer import Recorder


def _monitor(path: Path) -> Monitor:
    return Monitor(path, handle_signals=False, flush_interval=0.05)


def test_out_of_range_int_is_stored_as_float_and_the_writer_lives_on(tmp_path: Path) -> None:
    with _monitor(tmp_path / "run") as mon:
        for i in range(5):
            with mon.step():
                mon.log(x=i)
                if i == 2:
                    mon.log(tokens_seen=2**64, small=-(2**70))
        assert mon.flush()
        assert mon.recorder._thread.is_alive()
        assert mon.recorder.errors == []
    steps = gpudash.load_run(tmp_path / "run").steps
    assert list(steps["x"]) == [0, 1, 2, 3, 4]
    assert steps["tokens_seen"].iloc[2] == float(2**64)
    assert steps["small"].iloc[2] == float(-(2**70))


def test_unstorable_value_is_dropped_counted_and_said_once(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    with _monitor(tmp_path / "run") as mon:
        for i in range(4):
            with mon.step():
                mon.log(x=i, huge=10**400)  # beyond any float
        assert mon.flush()
        rec = mon.recorder
        assert rec._thread.is_alive()
        assert rec.dropped_values == 4
        assert len([e for e in rec.errors if "huge" in e]) == 1
    err = capfd.readouterr().err
    assert err.count("steps.huge") == 1
    run = gpudash.load_run(tmp_path / "run")
    assert list(run.steps["x"]) == [0, 1, 2, 3]
    assert (run.events["kind"] == "write_error").sum() == 1
    assert run.meta["dropped_values"] == 4


def test_writer_survives_any_exception_and_loses_only_the_bad_record(tmp_path: Path) -> None:
    class Evil:
        def __float__(self) -> float:
            raise RuntimeError("no")

        def __str__(self) -> str:
            raise RuntimeError("no text either")

    rec = Recorder(tmp_path / "run", flush_interval=0.05)
    rec.put("steps", {"step": 0, "time": 1.0, "a": 1.0})
    rec.put("steps", {"step": 1, "time": 2.0, "a": Evil()})
    rec.put("nosuchtable", {"x": 1})  # a record that fails inside SQL: isolated and dropped
    rec.put("steps", {"step": 2, "time": 3.0, "a": 3.0})
    assert rec.flush()
    assert rec._thread.is_alive()
    assert rec.dropped == 1 and rec.dropped_values == 1
    assert any("nosuchtable" in e for e in rec.errors)
    rec.close()
    steps = gpudash.load_run(tmp_path / "run").steps
    assert list(steps["step"]) == [0, 1, 2]
    assert steps["a"].isna().tolist() == [False, True, False]


@pytest.mark.parametrize("name", ["rank", "Rank", "RANK", "_rowid", "rowid", "step", "time", "duration_s",
                                  "bucket", "n", "loss__min", "x__max"])
def test_reserved_names_never_make_the_run_unreadable(tmp_path: Path, name: str,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    with _monitor(tmp_path / "run") as mon:
        for _i in range(3):
            with mon.step():
                mon.log(**{name: 7.0}, loss=1.0)
                mon.log_memory(**{name: 5})
        mon.flush()
    err = capfd.readouterr().err
    in_memory = name != "duration_s"  # the memory table has no duration_s of its own
    assert err.count("is a name gpudash uses itself") == 1 + in_memory  # once per log() and log_memory()
    run = gpudash.load_run(tmp_path / "run")
    assert list(run.steps["step"]) == [0, 1, 2]
    assert list(run.steps["rank"]) == [0, 0, 0]
    stored = namespaced_column(column_name(name))
    assert list(run.steps[stored]) == [7.0] * 3
    assert (run.events["kind"] == "reserved_name").sum() == 1 + in_memory
    assert list(run.memory["step"]) == [0, 1, 2]
    reader = run._reader
    assert reader is not None
    live, _ = reader.read_since(None)
    assert len(live["steps"]) == 3
    frame, level = reader.read_range("steps", max_rows=1)  # step tables are not rolled up: their rows
    assert level == 0 and list(frame[stored]) == [7.0] * 3


def test_reserved_name_from_a_collector_is_renamed_by_the_writer(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run", flush_interval=0.05)
    rec.put("host", {"time": 1.0, "rank": 3.0, "n": 2.0})
    rec.close()
    host = gpudash.load_run(tmp_path / "run").host
    assert list(host["rank"]) == [0]
    assert list(host["user_rank"]) == [3.0] and list(host["user_n"]) == [2.0]


# ---- a real full disk ------------------------------------------------------------------------

def _fill(path: Path) -> Path:
    filler = path / "filler"
    block = b"\0" * 65536
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_full_disk_is_said_once_and_writing_resumes_when_space_is_back(
        tmpfs_8m: Path, capfd: pytest.CaptureFixture[str]) -> None:
    mnt = tmpfs_8m
    mon = _monitor(mnt / "run")
    for i in range(5):
        with mon.step():
            mon.log(loss=float(i))
    assert mon.flush()
    filler = _fill(mnt)
    n, written = 5, True
    while written and n < 400:  # the log's own blocks (reused from its start) may take a few flushes
        with mon.step():
            mon.log(loss=float(n), new_scalar=n * 2.0)  # a new column while the disk is full
        n += 1
        written = mon.flush()
    assert not written  # not written (yet): flush says so
    for _ in range(3):
        with mon.step():
            mon.log(loss=float(n), new_scalar=n * 2.0)
        n += 1
        assert not mon.flush()
    assert any("cannot write" in e for e in mon.recorder.errors)
    assert capfd.readouterr().err.count("cannot write") == 1  # said once, at once
    os.unlink(filler)
    for _ in range(5):
        with mon.step():
            mon.log(loss=float(n), new_scalar=n * 2.0)
        n += 1
    assert mon.flush()
    assert mon.recorder._thread.is_alive()
    mon.close()
    run = gpudash.load_run(mnt / "run")
    assert list(run.steps["step"]) == list(range(n))  # kept in memory while full, none lost
    assert list(run.steps["new_scalar"].iloc[5:]) == [i * 2.0 for i in range(5, n)]
    ev = run.events[run.events["kind"] == "write_error"]
    assert len(ev) == 1 and "resumed" in ev["message"].iloc[0]
    assert run.status == "finished"
    assert run._reader is not None
    assert len(run._reader.read_range("steps", max_rows=1)[0]) == n  # the retried batch stored once
    run.close()


@pytest.mark.skipif(not hasattr(sqlite3.Connection, "setlimit"), reason="Connection.setlimit needs Python 3.11")
def test_more_scalars_than_sqlite_has_columns_for_keeps_the_steps(tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    rec = Recorder(tmp_path / "run", flush_interval=0.05)
    rec._conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, 40)  # as SQLite's 2000 with ~700 scalars, but fast
    for i in range(3):
        rec.put("steps", {"step": i, "time": 1.0 + i, "duration_s": 0.1, **{f"g{j}": float(j) for j in range(60)}})
    assert rec.flush()
    rec.close()
    assert capfd.readouterr().err.count("cannot be added") == 1
    run = gpudash.load_run(tmp_path / "run")
    steps = run.steps
    assert list(steps["step"]) == [0, 1, 2]  # the rows are there, with as many columns as fit
    assert 30 <= len(steps.columns) <= 41 and list(steps["g0"]) == [0.0] * 3
    assert run._reader is not None
    frame, level = run._reader.read_range("steps", max_rows=1)
    assert level == 0 and len(frame) == 3 and "g0" in frame
