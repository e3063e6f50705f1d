"""A run on a small disk: gpudash alone never fills it, and a disk filled by someone else and then
freed costs no record (issue 24). Needs root and tmpfs: skipped with the reason where mounting fails."""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from pathlib import Path

import gpudash
from gpudash.store.reader import RunReader
from gpudash.store.writer import Recorder

WAL_LIMIT = 4 << 20


def _fill(path: Path) -> Path:
    filler = path / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


class _Loop:
    """Records like a monitored loop's (a steps row with 4 phases and 3 scalars, a memory row, a host
    sample every 12th step), a flush every 6 steps; keeps the largest write-ahead log seen."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.step = 0
        self.wal = 0
        self.t = time.time()

    def run(self, steps: int) -> list[bool]:
        done = []
        for _ in range(steps):
            i, self.t = self.step, self.t + 1 / 12
            self.rec.put("steps", {"step": i, "time": self.t, "duration_s": 0.08, "data_s": 0.01, "forward_s": 0.02,
                                   "backward_s": 0.03, "optimizer_s": 0.02, "loss": 1 / (i + 1), "lr": 1e-3,
                                   "grad_norm": 1.0 + i % 7})
            self.rec.put("memory", {"step": i, "time": self.t, "params_bytes": 1e6, "grads_bytes": 1e6,
                                    "optimizer_bytes": 2e6, "activations_bytes": 3e5 + i % 11})
            if i % 12 == 0:
                self.rec.put("host", {"time": self.t, "cpu_pct": 50.0, "rss_bytes": 1e9 + i})
            self.step += 1
            if self.step % 6 == 0:
                done.append(self.rec.flush())
                wal = self.rec.path.with_name(self.rec.path.name + "-wal")
                self.wal = max(self.wal, wal.stat().st_size if wal.exists() else 0)
        return done


def test_a_transient_full_disk_loses_nothing_and_recording_resumes(tmpfs_8m: Path) -> None:
    mnt = tmpfs_8m
    rec = Recorder(mnt / "run", flush_interval=60)
    loop = _Loop(rec)
    assert all(loop.run(3000))  # ~4 min of a 12 steps/s loop: the old 64 KiB pages filled 8 MiB by itself
    filler = _fill(mnt)
    while_full = loop.run(120)
    assert not any(while_full[-10:])  # said: not written (yet); the log's own blocks took the first ones
    assert RunReader(mnt / "run").status() == "live"  # the heartbeat lives on while nothing can be written
    os.unlink(filler)
    assert all(loop.run(600)[1:])  # the first flush after freeing writes the backlog
    rec.close()
    assert loop.wal <= WAL_LIMIT
    run = gpudash.load_run(mnt / "run")
    assert run.status == "finished"
    assert run.steps["step"].tolist() == list(range(3720))  # kept in memory while full: none lost
    assert len(run.memory) == 3720 and run.meta.get("dropped_records", 0) == 0
    assert run.events["kind"].tolist().count("write_error") == 1  # "could not write ..., resumed"
    run.close()
    with sqlite3.connect(mnt / "run" / "rank0.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("SELECT sum(n) FROM host_r60").fetchone()[0] == 310  # roll-ups: each sample once
