"""What the outside world puts in a run folder never breaks a surface (issue 12, items 5-7).

Wrong-typed facts in ``run.json`` or a rank's ``meta`` table, column names with
quotes, a killed run on read-only storage and a write-ahead log without its
database: each is read, or its damage named, and every other run still lists.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudash.commands.export import export_run
from gpudash.commands.info import summarize as info_lines
from gpudash.report import render_html, render_markdown
from gpudash.store import load_run
from gpudash.store.meta import META_KEYS
from gpudash.store.reader import RunReader
from gpudash.store.rollup import Rollups
from gpudash.store.writer import Recorder

ROOT = Path(__file__).resolve().parents[2]


def _run(path: Path, n: int = 5, **meta: Any) -> Path:
    rec = Recorder(path, flush_interval=60, meta={"name": path.name, **meta})
    for i in range(n):
        rec.put("steps", {"step": i, "time": 1e9 + i, "duration_s": 0.1, "tokens": 10.0})
        rec.put("memory", {"step": i, "time": 1e9 + i, "allocated_bytes": 1e6})
    rec.put("events", {"time": 1e9, "step": 0, "kind": "k", "message": "m", "data": None})
    rec.close()
    return path


def _set_rank_meta(run_dir: Path, **raw: str) -> None:
    """Write meta values as raw text (what a hand edit or another tool leaves)."""
    conn = sqlite3.connect(run_dir / "rank0.db")
    with conn:
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", list(raw.items()))
    conn.close()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gpudash", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


# ---- 5. wrong-typed run.json / meta values ------------------------------------------------
BAD_RUN_JSON = {
    "ws_text": '{"world_size": "two"}',
    "nan_inf": '{"created_at": NaN, "world_size": 1e400}',
}


@pytest.fixture
def bad_runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    _run(runs / "good")
    for name, text in BAD_RUN_JSON.items():
        (_run(runs / name) / "run.json").write_text(text)
    _set_rank_meta(_run(runs / "flush_text"), flush_interval='"x"', status='"live"', heartbeat="1e9")
    return runs


def test_wrong_typed_meta_is_named_and_falls_back(bad_runs: Path) -> None:
    ws = load_run(bad_runs / "ws_text")
    assert ws.meta["world_size"] == 1
    assert any("run.json: world_size is 'two'" in p and "ignored" in p for p in ws.problems)
    nan = load_run(bad_runs / "nan_inf")
    assert "created_at" not in nan.meta and nan.meta["world_size"] == 1
    assert any("created_at is nan" in p for p in nan.problems)
    assert any("world_size is inf" in p for p in nan.problems)
    fi = load_run(bad_runs / "flush_text")
    assert fi.status == "crashed"  # live, but no heartbeat for ages: the default interval applies
    assert any("rank0.db meta: flush_interval is 'x'" in p for p in fi.problems)
    assert all("\n" not in p for r in (ws, nan, fi) for p in r.problems)


@pytest.mark.parametrize("name", [*BAD_RUN_JSON, "flush_text"])
def test_cli_surfaces_survive_wrong_typed_meta(bad_runs: Path, name: str, tmp_path: Path) -> None:
    run_dir = str(bad_runs / name)
    info = _cli("info", run_dir, cwd=tmp_path)
    assert info.returncode == 0 and "Traceback" not in info.stderr, info.stderr
    assert "ignored" in info.stdout  # the damage is named
    if name != "ws_text":
        return  # report and export go through the same load_run: once is enough
    for args in (["report", run_dir, "--format", "md"], ["export", run_dir, "--format", "csv", "-o", str(tmp_path)]):
        out = _cli(*args, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr + out.stdout


def test_runs_list_shows_the_others_and_names_the_bad_one(bad_runs: Path) -> None:
    from gpudash.server.app import create_app

    client = create_app(bad_runs).server.test_client()
    r = client.get("/api/runs")
    assert r.status_code == 200
    runs = {row["id"]: row for row in r.get_json()["runs"]}
    assert set(runs) == {"good", *BAD_RUN_JSON, "flush_text"}
    assert runs["good"]["problems"] == [] and runs["good"]["steps"] == 5
    assert any("world_size" in p for p in runs["ws_text"]["problems"])
    assert any("flush_interval" in p for p in runs["flush_text"]["problems"])
    index = client.get("/_dash-layout")
    assert index.status_code == 200


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) \
        | st.sampled_from([2**63, -(2**63) - 1, 10**30, 1e400, -1e400])
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)


_KEYS = sorted(META_KEYS) + ["unavailable_allocator"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("prop") / "base")


_ALL = st.fixed_dictionaries({}, optional={k: _json_values() for k in _KEYS})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_json=_ALL, rank_meta=_ALL)
def test_any_json_value_for_any_known_key(base_run: Path, run_json: dict[str, Any],
                                          rank_meta: dict[str, Any]) -> None:
    from gpudash.analysis.summary import summarize as verdicts
    from gpudash.server.layouts.runs import list_runs, runs_page

    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        run_dir = runs / "r"
        shutil.copytree(base_run, run_dir)
        (run_dir / "run.json").write_text(json.dumps(run_json))  # NaN and Infinity as Python writes them
        _set_rank_meta(run_dir, **{k: json.dumps(v) for k, v in rank_meta.items()})
        run = load_run(run_dir)
        for key in _KEYS:
            clean = run.meta.get(key)
            if clean is not None and key in META_KEYS:
                assert META_KEYS[key](clean) == clean  # every known key reaching a surface has its type
            if isinstance(clean, float):
                assert math.isfinite(clean)
        info_lines(run)
        render_markdown(run, verdicts(run))
        render_html(run)
        export_run(run_dir, Path(tmp) / "out", "csv")
        run.close()
        rows = list_runs(runs)
        assert [r["id"] for r in rows] == ["r"] and rows[0]["status"] != "unreadable"
        runs_page(runs, rows)


def test_run_json_that_is_not_an_object_is_named(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "r")
    (run_dir / "run.json").write_text("[1, 2]")
    run = load_run(run_dir)
    assert len(run.steps) == 5
    assert any("run.json: holds a list" in p for p in run.problems)


# ---- 6. column names with a double quote --------------------------------------------------
def test_quoted_column_names_read_intact(tmp_path: Path) -> None:
    run_dir = _run(tmp_path / "q", n=10)
    conn = sqlite3.connect(run_dir / "rank0.db")
    with conn:
        conn.execute('ALTER TABLE steps ADD COLUMN "a""b" REAL')
        conn.execute('UPDATE steps SET "a""b" = step * 2')
        conn.execute('ALTER TABLE events ADD COLUMN "x""y" TEXT')
        conn.execute("UPDATE events SET \"x\"\"y\" = 't'")
    conn.close()
    run = load_run(run_dir)
    assert run.problems == []
    assert len(run.steps) == 10 and run.steps['a"b'].tolist() == [2.0 * i for i in range(10)]
    assert run.events['x"y'].tolist() == ["t"]
    reader = RunReader(run_dir)
    frame, level = reader.read_range("steps", 0, 2e9)
    assert level == 0 and len(frame) == 10
    tail, _ = reader.read_since()
    assert len(tail["steps"]) == 10 and reader.all_problems() == []
    reader.close()


def test_rollup_of_a_quoted_column(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute('CREATE TABLE steps (time REAL, "a""b" REAL)')
    roll = Rollups(conn)
    arr = np.array([[1.0, 2.0], [1.5, 4.0]])
    roll.update("steps", ["time", 'a"b'], arr)
    roll.write()
    row = conn.execute('SELECT n, "a""b", "a""b__max" FROM steps_r1').fetchone()
    assert row == (2, 3.0, 4.0)


# ---- 7. killed runs on read-only storage, and a log without its database ------------------
_KILLED = """
import sys, time
from gpudash.store.writer import Recorder
rec = Recorder(sys.argv[1], flush_interval=60)
for i in range(500):
    rec.put("steps", {"step": i, "time": 1e9 + i, "duration_s": 0.1})
rec.flush()
print("flushed", flush=True)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose writer was SIGKILLed: every record is in ``rank0.db-wal``, the ``-shm`` is gone
    (as after a copy that skips it, or a reboot of the node that held it)."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _KILLED, str(run_dir)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "flushed"
    finally:
        p.kill()
        p.wait()
    (run_dir / "rank0.db-shm").unlink()
    assert (run_dir / "rank0.db-wal").stat().st_size > (run_dir / "rank0.db").stat().st_size
    return run_dir


def _mount(target: Path, *args: str) -> None:
    out = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount here ({out.stderr.strip() or 'mount failed'}); needs root outside a sandbox")


def test_killed_run_on_read_only_mount_reads_every_record(killed_run: Path, tmp_path: Path) -> None:
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("a real read-only mount needs root and mount(8)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _mount(mnt, "-t", "tmpfs", "tmpfs")
    try:
        shutil.copytree(killed_run, mnt / "run")
        _mount(mnt, "-o", "remount,ro")
        files = sorted(os.listdir(mnt / "run"))
        run = load_run(mnt / "run")
        assert len(run.steps) == 500 and run.steps["step"].tolist() == list(range(500))
        assert run.problems == [] and run.status == "crashed"
        run.close()
        assert sorted(os.listdir(mnt / "run")) == files  # nothing written (it could not be)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)  # lazy: even if a failed assert holds a file


_READ_AS_NOBODY = """
import os, sys
from gpudash.store import load_run  # imported first: the interpreter's own files may be root-only
os.setgid(65534); os.setuid(65534)
run = load_run(sys.argv[1])
print(len(run.steps), run.problems)
"""


def test_killed_run_in_read_only_folder_reads_every_record(killed_run: Path) -> None:
    # permission bits do not stop root: when root, read as nobody in a child process
    top = Path(tempfile.mkdtemp(prefix="gpudash-ro-"))
    try:
        os.chmod(top, 0o755)
        run_dir = top / "run"
        shutil.copytree(killed_run, run_dir)
        for f in run_dir.iterdir():
            os.chmod(f, 0o444)
        os.chmod(run_dir, 0o555)
        if os.geteuid() == 0:
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            out = subprocess.run([sys.executable, "-c", _READ_AS_NOBODY, str(run_dir)], capture_output=True,
                                 text=True, env=env, cwd="/", timeout=60)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == "500 []"
        else:
            run = load_run(run_dir)
            assert len(run.steps) == 500 and run.problems == []
            run.close()
        assert not (run_dir / "rank0.db-shm").exists()
    finally:
        os.chmod(top / "run", 0o755)
        shutil.rmtree(top)


def test_orphan_log_is_read_and_named(killed_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "orphan"
    shutil.copytree(killed_run, run_dir)
    (run_dir / "rank0.db").unlink()
    (run_dir / "run.json").write_text('{"name": "orphan"}')
    run = load_run(run_dir)
    assert len(run.steps) == 500
    assert any("rank0.db is missing, only its write-ahead log rank0.db-wal is left" in p for p in run.problems)
    run.close()
    assert sorted(os.listdir(run_dir)) == ["rank0.db-wal", "run.json"]  # the original is left alone


def test_orphan_log_that_holds_nothing_is_named(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _run(runs / "good")
    bad = runs / "bad"
    bad.mkdir()
    (bad / "rank0.db-wal").write_bytes(b"\x00" * 4096)
    run = load_run(bad)
    assert run.steps.empty
    assert any("rank0.db is missing" in p and "not a SQLite log" in p for p in run.problems)
    from gpudash.server.layouts.runs import list_runs

    rows = {r["id"]: r for r in list_runs(runs)}
    assert rows["good"]["steps"] == 5
    assert any("rank0.db is missing" in p for p in rows["bad"]["problems"])


def test_page_caches_are_bounded(tmp_path: Path) -> None:
    """SQLite's default page cache (2 MB) filled over a watched run's first ~10,000 steps; a reader's connection
    is capped at CACHE_KIB, the writer's (appends only) at WRITER_CACHE_KIB, full within a run's first steps."""
    from gpudash.store.bounded import connect as read_connect
    from gpudash.store.schema import CACHE_KIB
    from gpudash.store.tables import WRITER_CACHE_KIB
    from gpudash.store.tables import connect as write_connect

    db = tmp_path / "x.db"
    w = write_connect(db)
    w.execute("CREATE TABLE t (a)")
    r = read_connect(db)
    try:
        assert w.execute("PRAGMA cache_size").fetchone()[0] == -WRITER_CACHE_KIB and WRITER_CACHE_KIB <= CACHE_KIB
        assert r.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB
    finally:
        r.close()
        w.close()
