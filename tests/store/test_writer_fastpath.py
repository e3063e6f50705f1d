"""Rows of plain numbers skip the per-value conversion: what is stored is the same either way."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.store import tables
from gpudash.store.writer import Recorder

_ROWS: list[dict[str, Any]] = [
    {"step": 0, "time": 1.0, "duration_s": 0.5, "loss": 2.5, "ok": True, "n": None},
    {"step": 1, "time": 2.0, "duration_s": 0.5, "loss": math.inf, "ok": False, "big": 2**64},
    {"step": 2, "time": 3.0, "duration_s": 0.5, "loss": 1e20, "edge": 2**63 - 1, "neg": -(2**63)},
    {"step": 3, "time": 4.0, "duration_s": 0.5, "loss": math.nan, "tokens": 10**400},
    {"step": 4, "time": 5.0, "duration_s": 0.5, "loss": 1.0, "note": "text", "raw": b"\x00"},
]


def _write(path: Path, rows: list[dict[str, Any]]) -> tuple[list[tuple[Any, ...]], list[str]]:
    rec = Recorder(path, flush_interval=60)
    for r in rows:
        rec.put("steps", dict(r))
    assert rec.flush()
    errors = list(rec.errors)
    rec.close()
    with sqlite3.connect(path / "rank0.db") as conn:
        cols = [c for _, c, *_ in conn.execute("PRAGMA table_info(steps)")]
        got = conn.execute(f"SELECT {', '.join(cols)} FROM steps ORDER BY rowid").fetchall()
    return [tuple(zip(cols, row, strict=True)) for row in got], errors


def _same(a: Any, b: Any) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or (
        a == b and type(a) is type(b))


def test_fast_and_per_value_paths_store_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, fast_errors = _write(tmp_path / "fast", _ROWS)
    monkeypatch.setattr(tables, "_plain_numbers", lambda rows: None)  # every value through cell()
    slow, slow_errors = _write(tmp_path / "slow", _ROWS)
    assert len(fast) == len(slow) == len(_ROWS)
    for f, s in zip(fast, slow, strict=True):
        assert all(fc == sc and _same(fv, sv) for (fc, fv), (sc, sv) in zip(f, s, strict=True)), (f, s)
    assert fast_errors == slow_errors
    row1 = dict(fast[1])
    assert row1["big"] == float(2**64) and row1["ok"] == 0  # beyond 64 bits: a float; a bool: 0/1
    assert dict(fast[3])["tokens"] is None and any("tokens" in e for e in fast_errors)  # beyond any float


def test_a_batch_of_plain_numbers_reads_back_through_the_reader(tmp_path: Path) -> None:
    rows = [{"step": i, "time": 1.0 + i, "duration_s": 0.1, "loss": 1.0 / (i + 1), "samples": 8, "flag": i % 2 == 0}
            for i in range(5000)]  # more than one slice
    _write(tmp_path / "run", rows)
    run = gpudash.load_run(tmp_path / "run")
    steps = run.steps
    assert list(steps["step"]) == list(range(5000))
    assert steps["loss"].iloc[4999] == pytest.approx(1 / 5000) and steps["samples"].sum() == 8 * 5000
    assert run._reader is not None
    frame, level = run._reader.read_range("steps", max_rows=100)  # a step table: its rows, never a roll-up
    assert level == 0 and len(frame) == 5000
    run.close()
