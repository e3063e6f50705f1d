"""Issue 41: malloc's in-use bytes read at step boundaries on the training thread, into the step's memory row;
how often is set by the read's own cost against the step time (never a timer), a failed step is not read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpudash.collectors.host import HELD_MAX_EVERY, HeldSampler, malloc_used
from gpudash.monitor import Monitor


class _Rec:
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def memory_row(self, step: int, values: dict[str, Any]) -> None:
        self.rows.setdefault(step, {}).update(values)


def _monitor(tmp_path: Path, rec: _Rec, in_use: Any) -> tuple[Monitor, HeldSampler]:
    mon = Monitor(tmp_path / "run", host_hz=0, leak_poll_s=0, handle_signals=False)
    held = HeldSampler(in_use, rec)  # type: ignore[arg-type]
    mon.add_step_hooks(end_due=held.on_step_end)  # as HostCollector registers it
    return mon, held


def test_every_step_of_a_slow_loop_is_read_at_its_end(tmp_path: Path) -> None:
    rec, n = _Rec(), iter(range(1000, 2000))
    mon, _ = _monitor(tmp_path, rec, lambda: next(n))
    with mon:
        for _ in range(20):
            with mon.step():
                time.sleep(0.002)  # the read costs far less than 1 % of such a step
        with pytest.raises(RuntimeError), mon.step():  # a failed step (an OOM the loop retries) is not read
            raise RuntimeError("boom")
    assert sorted(rec.rows) == list(range(20)) and rec.rows[3] == {"malloc_used_bytes": 1003}


def test_a_loop_of_tiny_steps_is_read_rarely(tmp_path: Path) -> None:
    rec = _Rec()
    def slow_read() -> int:
        time.sleep(0.002)  # a read costing far more than 1 % of the empty steps below
        return 1

    mon, held = _monitor(tmp_path, rec, slow_read)
    with mon:
        for _ in range(3 * HELD_MAX_EVERY):
            with mon.step():
                pass
    assert sorted(rec.rows) == [0, HELD_MAX_EVERY, 2 * HELD_MAX_EVERY] and held.every == HELD_MAX_EVERY


def test_malloc_used_reads_this_process_where_glibc_has_mallinfo2() -> None:
    used = malloc_used()
    if used is not None:  # glibc >= 2.33 (the CI image); elsewhere the rule falls back to the RSS
        before = used()
        keep = bytearray(8 * 2**20)
        assert used() >= before + 8 * 2**20 - 2**16
        del keep
