"""Truncated and corrupted run files: load what is intact, name what is not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from gpudash.store import load_run
from gpudash.store.writer import Recorder


def _run(path: Path, n: int = 20_000) -> Path:
    rec = Recorder(path, flush_interval=60)
    for i in range(n):
        rec.put("steps", {"step": i, "time": 1e9 + i, "duration_s": 0.01, "loss": 1.0})
        if i % 2000 == 1999:
            rec.flush()
    rec.put("events", {"time": 1e9, "step": 0, "kind": "k", "message": "m", "data": None})
    rec.close()
    return path


def test_truncated_file_loads_intact_part(tmp_path: Path) -> None:
    src = _run(tmp_path / "src")
    dst = tmp_path / "trunc"
    shutil.copytree(src, dst)
    db = dst / "rank0.db"
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.truncate(size // 2)
    run = load_run(dst)
    assert run.problems, "damage must be named"
    assert any("rank0.db" in p for p in run.problems)
    assert 0 < len(run.steps) < 20_000
    assert run.steps["step"].is_monotonic_increasing


def test_garbage_in_the_middle(tmp_path: Path) -> None:
    src = _run(tmp_path / "src")
    dst = tmp_path / "garbage"
    shutil.copytree(src, dst)
    db = dst / "rank0.db"
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.seek(size // 3)
        f.write(b"\xde\xad\xbe\xef" * 4096)
    run = load_run(dst)
    steps = run.steps
    assert len(steps) > 0
    # whatever is shown is right (chunks carry a checksum), and any loss is named
    assert (steps["time"] == 1e9 + steps["step"]).all() and (steps["loss"] == 1.0).all()
    if len(steps) < 20_000:
        assert run.problems
    # the original is untouched: reading never writes
    assert len(load_run(src).steps) == 20_000 and not load_run(src).problems


def test_destroyed_header_is_named_and_other_ranks_load(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    for rank in (0, 1):
        rec = Recorder(run_dir, rank=rank, flush_interval=60)
        rec.put("steps", {"step": 0, "time": 1.0, "duration_s": 0.1})
        rec.close()
    with open(run_dir / "rank1.db", "r+b") as f:
        f.write(b"this is not sqlite" * 10)
    run = load_run(run_dir)
    assert run.steps["rank"].tolist() == [0]
    assert any("rank1.db" in p for p in run.problems)


def test_cli_names_the_damage_in_one_line(tmp_path: Path) -> None:
    src = _run(tmp_path / "src", 5000)
    with open(src / "rank0.db", "r+b") as f:
        f.truncate(src.joinpath("rank0.db").stat().st_size // 2)
    out = subprocess.run([sys.executable, "-m", "gpudash", "info", str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert "damaged" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "gpudash", "info", str(tmp_path / "missing")],
                         capture_output=True, text=True)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "no such run directory" in bad.stderr
