"""Attempts: a process that writes into a recorded run is a new attempt; nothing of any attempt is lost
(locally and on S3 through moto's server), steps a later attempt redid are superseded in every default read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from helpers.s3 import bucket
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash import load_run
from gpudash.analysis.facts import headline_rows, run_facts
from gpudash.errors import RunError
from gpudash.monitor import Monitor
from gpudash.store.attempts import attempt_starts, supersede
from gpudash.store.objstore import open_store
from gpudash.store.ranged import read_published

KW = {"flush_interval": 0.05, "host_hz": 0.0, "handle_signals": False}


def _record(mon: Monitor, steps: range, base: float, step: int | None = None) -> None:
    for n, i in enumerate(steps):
        with mon.step(step=step if n == 0 else None):
            mon.log(loss=base + i)


def _location(kind: str, tmp_path: Path, request: pytest.FixtureRequest, name: str) -> str:
    if kind == "local":
        return str(tmp_path / name)
    request.getfixturevalue("s3")
    if not open_store("s3://runs").fs.exists("runs"):
        bucket("runs")
    return f"s3://runs/{name}"


def test_supersede_keeps_each_step_once_from_the_latest_attempt() -> None:
    df = pd.DataFrame({"rank": [0] * 7 + [1] * 2, "step": [0, 1, 2, 3, 1, 2, 9, 0, 1],
                       "attempt": [1, 1, 1, 1, 2, 2, 3, 1, 1], "v": range(9)})
    starts = attempt_starts(df)
    assert starts == {(0, 1): 0, (0, 2): 1, (0, 3): 9, (1, 1): 0}
    out = supersede(df, starts)
    # attempt 2 resumed at 1: attempt 1's 1..3 are superseded (3 too: purged like TensorBoard's purge_step)
    assert out[out["rank"] == 0]["v"].tolist() == [0, 4, 5, 6]
    assert out[out["rank"] == 1]["v"].tolist() == [7, 8]  # another rank's attempts are its own


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_two_attempts_read_as_one_run_and_lose_nothing(kind: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    where = _location(kind, tmp_path, request, "two")
    with Monitor(where, **KW) as mon:
        assert mon.attempt == 1
        _record(mon, range(13), 0.0)
    with Monitor(where, resume=True, **KW) as mon:
        assert mon.attempt == 2 and mon.step_index == 13  # nothing told: after the last recorded step
        _record(mon, range(10, 20), 100.0, step=10)  # the script says it resumed at 10
    run = load_run(where)
    try:
        s = run.steps
        assert s["step"].tolist() == list(range(20))
        assert s["loss"].tolist() == [float(i) for i in range(10)] + [100.0 + i for i in range(10, 20)]
        assert s["attempt"].tolist() == [1] * 10 + [2] * 10
        assert run.memory["step"].is_unique
        ev = run.events[run.events["kind"] == "resume"]
        assert len(ev) == 1
        data = ev["data"].iloc[0]
        assert data["attempt"] == 2 and data["step"] == 10 and data["previous_end"] == "finished"
        assert data["previous_last_step"] == 12 and data["gap_s"] >= 0 and data["step_from"] == "monitor.step(step=k)"
        assert ev["message"].iloc[0].startswith("attempt 2 resumed at step 10 after ")
        assert run.meta["attempt"] == 2 and run.meta["attempts"][0]["end"] == "finished"
        facts = run_facts(run)
        assert facts.steps == 20 and facts.attempts == 2 and facts.loss_spike_steps == ()
        assert dict(headline_rows(facts, run.meta))["attempts"].startswith("2 attempts: attempt 2 resumed at step 10")
    finally:
        run.close()
    every = load_run(where, attempts="all")
    try:
        s = every.steps
        assert len(s) == 23 and s["attempt"].tolist() == [1] * 13 + [2] * 10  # attempt 1's 10..12 still there
        assert s[s["attempt"] == 1]["loss"].tolist() == [float(i) for i in range(13)]
    finally:
        every.close()
    if kind == "s3":  # the second attempt's segments numbered after the first's: no name taken twice
        names = sorted(n for n in open_store(where).find("segments") if "/steps/" in n)
        assert names == ["segments/rank=0/steps/000000000000-000000000013.parquet",
                         "segments/rank=0/steps/000000000013-000000000023.parquet"]
        # read straight from the bucket: each step once, from its latest attempt, as load_run reads it
        tab = read_published(where, "steps", ["step", "loss"])
        assert tab["step"].to_pylist() == list(range(20)) and tab["attempt"].to_pylist()[9:11] == [None, 2]
        assert tab["loss"].to_pylist() == [float(i) for i in range(10)] + [100.0 + i for i in range(10, 20)]
        assert read_published(where, "steps", ["loss"]).column_names == ["_rowid", "loss", "attempt", "rank"]
        assert read_published(where, "steps", ["step"], superseded=True).num_rows == 23
        assert read_published(where, "steps", ["step"], after=13)["step"].to_pylist() == list(range(10, 20))
        mem_run = _location(kind, tmp_path, request, "two-memory")  # a per-step table superseded by the steps'
        for attempt, steps in ((1, range(6)), (2, range(3, 8))):
            with Monitor(mem_run, resume=True, **KW) as mon:
                for i in steps:
                    with mon.step(step=i if attempt == 2 and i == 3 else None):
                        mon.log_memory(extra_bytes=attempt)
        mem = read_published(mem_run, "memory", ["extra_bytes"])
        assert mem["extra_bytes"].to_pylist() == [1] * 3 + [2] * 5 and "step" not in mem.column_names
        assert read_published(mem_run, "memory", ["step"], superseded=True)["step"].to_pylist() == [*range(6), *range(3, 8)]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_one_rank_of_four_restarted_and_a_requeued_two_rank_job(kind: str, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    elastic = _location(kind, tmp_path, request, "elastic")
    for rank in range(4):  # rank 2 dies after step 19 and is restarted from step 15
        with Monitor(elastic, rank=rank, world_size=4, **KW) as mon:
            _record(mon, range(20 if rank == 2 else 30), 10.0 * rank)
    with Monitor(elastic, rank=2, world_size=4, resume=True, **KW) as mon:
        _record(mon, range(15, 30), 1000.0, step=15)
    run = load_run(elastic)
    try:
        for rank in range(4):
            s = run.steps[run.steps["rank"] == rank]
            assert s["step"].tolist() == list(range(30)), rank
        assert run.steps[run.steps["rank"] == 2]["loss"].tolist()[14:16] == [34.0, 1015.0]
        assert (run.events["kind"] == "resume").sum() == 1 and run_facts(run).attempts == 2
    finally:
        run.close()
    every = load_run(elastic, attempts="all")
    assert len(every.steps) == 3 * 30 + 20 + 15
    every.close()
    if kind == "s3":  # a restarted rank's attempts are its own: the other ranks' rows all stay
        tab = read_published(elastic, "steps", ["step"]).to_pandas()
        assert tab.groupby("rank")["step"].apply(list).tolist() == [list(range(30))] * 4

    requeued = _location(kind, tmp_path, request, "requeued")
    for attempt in (1, 2):
        for rank in range(2):
            with Monitor(requeued, rank=rank, world_size=2, resume=True, **KW) as mon:
                _record(mon, range(20) if attempt == 1 else range(10, 30), 100.0 * attempt, step=None
                        if attempt == 1 else 10)
    run = load_run(requeued)
    try:
        assert run.steps.groupby("rank")["step"].apply(list).tolist() == [list(range(30))] * 2
        assert (run.events["kind"] == "resume").sum() == 2 and run_facts(run).attempts == 2
    finally:
        run.close()
    every = load_run(requeued, attempts="all")
    assert len(every.steps) == 2 * (20 + 20)
    every.close()


_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from gpudash.monitor import Monitor
    from gpudash.store import publish
    publish.PUBLISH_INTERVAL_S = 0.0
    mon = Monitor(sys.argv[1], flush_interval=0.05, host_hz=0.0, handle_signals=False)
    for i in range(5):
        with mon.step():
            mon.log(loss=float(i))
    mon.flush()
    if mon.recorder._publisher is not None:
        assert mon.recorder._publisher.uploaded(60)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    print("ready", flush=True)
    sys.stdin.read()
    mon.close()
""")


def _child(run_dir: Path | str, mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(run_dir), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def test_an_attempt_killed_by_sigkill_is_ended_when_the_next_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    proc = _child(run_dir, "kill")
    assert proc.wait(timeout=120) == -signal.SIGKILL
    with Monitor(run_dir, resume=True, **KW) as mon:
        assert mon.attempt == 2 and mon.step_index == 5
        _record(mon, range(5, 8), 50.0)
    run = load_run(run_dir)
    try:
        assert run.status == "finished" and run.steps["step"].tolist() == list(range(8))
        before = run.meta["attempts"][0]
        assert before["status"] == "ended" and before["end"] == "killed" and before["last_step"] == 4
        ev = run.events[run.events["kind"] == "resume"].iloc[0]
        assert ev["data"]["previous_end"] == "killed" and "after the last recorded step" in ev["message"]
    finally:
        run.close()


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_second_process_racing_the_first_is_refused(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_dir = _location(kind, tmp_path, request, "race")
    proc = _child(run_dir, "wait")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with pytest.raises(RunError, match=r"process \d+ on .* is still recording this run"):
            Monitor(run_dir, **KW)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    run = load_run(run_dir)  # the first process's run, untouched by the refused one
    try:
        assert run.status == "finished" and run.steps["step"].tolist() == list(range(5))
        assert "attempt" not in run.steps and not (run.events["kind"] == "resume").any()
    finally:
        run.close()


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_superseded_rows_leave_each_step_once_with_its_latest_value(attempts: list[tuple[int, int]]) -> None:
    """Any sequence of attempts (each resumes at some step and records some steps): the default read has every
    step once, from the last attempt that recorded it, and no step a later attempt purged (resumed before it)."""
    rows = []
    for a, (start, n) in enumerate(attempts, 1):
        rows += [{"rank": 0, "step": s, "attempt": a, "v": 1000 * a + s} for s in range(start, start + n)]
    out = supersede(pd.DataFrame(rows), attempt_starts(pd.DataFrame(rows)))
    assert out["step"].is_unique
    for _, row in out.iterrows():
        a, s = int(row["attempt"]), int(row["step"])
        later = [st_ for st_, _ in attempts[a:]]  # the attempts after this one: none resumed at or before s
        assert all(b > s for b in later) and row["v"] == 1000 * a + s
    kept = set(out["step"])
    for a, (start, n) in enumerate(attempts, 1):
        if all(b > start + n - 1 for b, _ in attempts[a:]):
            assert set(range(start, start + n)) <= kept  # an attempt no later one purged is all there


def test_a_column_named_attempt_in_a_run_no_process_resumed_is_a_logged_value(tmp_path: Path) -> None:
    """An older run (or anyone's file) with a steps column ``attempt``: read as it is, nothing superseded."""
    import sqlite3

    run_dir = tmp_path / "old"
    with Monitor(run_dir, **KW) as mon:
        _record(mon, range(6), 0.0)
    with sqlite3.connect(run_dir / "rank0.db") as c:
        c.execute("ALTER TABLE steps ADD COLUMN attempt INTEGER")
        c.execute("UPDATE steps SET attempt = 7 WHERE step >= 3")
    run = load_run(run_dir)
    try:
        assert run.steps["step"].tolist() == list(range(6)) and run_facts(run).attempts == 1
    finally:
        run.close()
