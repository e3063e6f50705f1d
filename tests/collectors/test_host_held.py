"""Issue 41: malloc's in-use bytes read at step boundaries on the training thread, into the step's memory row;
how often is set by the read's own cost against the step time (never a timer), a failed step is not read."""

from __future__ import annotations

from typing import Any

from gpudash.collectors.host import HELD_MAX_EVERY, HeldSampler, malloc_used


class _Rec:
    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def memory_row(self, step: int, values: dict[str, Any]) -> None:
        self.rows.setdefault(step, {}).update(values)


def test_every_step_of_a_slow_loop_is_read_at_its_end() -> None:
    rec, n = _Rec(), iter(range(1000, 2000))
    held = HeldSampler(lambda: next(n), rec)  # type: ignore[arg-type]
    for step in range(20):
        held.on_step_end(step, {"duration_s": 1.0})
    held.on_step_end(20, {"duration_s": 1.0, "failed": 1})
    assert sorted(rec.rows) == list(range(20)) and rec.rows[3] == {"malloc_used_bytes": 1003}


def test_a_loop_of_tiny_steps_is_read_rarely() -> None:
    rec = _Rec()
    held = HeldSampler(lambda: 1, rec)  # type: ignore[arg-type]
    for step in range(3 * HELD_MAX_EVERY):
        held.on_step_end(step, {"duration_s": 1e-12})  # the read costs far more than 1 % of such a step
    assert sorted(rec.rows) == [0, HELD_MAX_EVERY, 2 * HELD_MAX_EVERY]


def test_malloc_used_reads_this_process_where_glibc_has_mallinfo2() -> None:
    used = malloc_used()
    if used is not None:  # glibc >= 2.33 (the CI image); elsewhere the rule falls back to the RSS
        before = used()
        keep = bytearray(8 * 2**20)
        assert used() >= before + 8 * 2**20 - 2**16
        del keep
