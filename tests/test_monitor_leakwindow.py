"""The leak watch's window (issue 47 item 4, issue 41 (d)(e)): the rows reach the watch in-process as they are
recorded (the watch never opens the run's file nor makes the writer flush), into fixed rings that never grow;
and a leak that starts late in a long window is named within 100 steps of its start."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudash import load_run
from gpudash.analysis.leak import LEAK_EVENT, Leak, LeakFrame, leak_of, recorded_leaks
from gpudash.analysis.leak_rule import judge
from gpudash.monitor import Monitor
from gpudash.monitor.leakwatch import LOOK_STEPS
from gpudash.monitor.leakwindow import KEEP_ROWS, LeakWindow

MiB = 2**20
BASE = 2 * 2**30


def test_the_watch_gets_its_rows_in_process_and_never_reads_the_run_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import gpudash.store.rankreader as rankreader
    from gpudash.store.writer import Recorder

    opened: list[Any] = []
    flushed_by_watch: list[str] = []
    real_init, real_flush = rankreader.RankReader.__init__, Recorder.flush

    def spy_init(self: Any, *a: Any, **k: Any) -> None:
        opened.append(a)
        real_init(self, *a, **k)

    def spy_flush(self: Recorder, timeout: float = 10.0) -> bool:
        if threading.current_thread().name == "gpudash-leak":
            flushed_by_watch.append("flush")
        return real_flush(self, timeout)

    monkeypatch.setattr(rankreader.RankReader, "__init__", spy_init)
    monkeypatch.setattr(Recorder, "flush", spy_flush)
    steps = 400
    with Monitor(tmp_path / "r", host_hz=0, leak_poll_s=0.05, handle_signals=False) as m:
        watch = m._leaks
        assert watch is not None and m.recorder.tap == watch.window.tap
        for i in range(steps):
            with m.step(tokens=64):
                m.log_memory(allocated_bytes=BASE + i * MiB)
            assert watch.window.rings["memory"].n == i + 1  # handed over as it was recorded, not read back
            if i % 25 == 0 and not watch.found:
                time.sleep(0.1)  # the watch looks (every 0.05 s) while the loop runs
        assert watch.found, "the watch found no leak while the loop ran"
        # the step rows: read from the step log as they were packed, at the watch's ticks (none missed)
        assert watch.window.rings["steps"].n >= watch.found[0].last_step and watch.window._cursor.missed == 0
    assert m.recorder.tap is None  # the watch is gone with the Monitor
    assert opened == [] and flushed_by_watch == []
    run = load_run(tmp_path / "r")
    try:
        [live] = recorded_leaks(run)
        assert abs(live.per_step_bytes - MiB) < 0.01 * MiB and live.last_step < steps - 1
        assert (run.events["kind"] == LEAK_EVENT).sum() == 1
    finally:
        run.close()


def test_the_window_is_bounded_and_keeps_the_newest_rows_oldest_first() -> None:
    class Loud:
        def __float__(self) -> float:  # a tensor would sync the GPU here: the window never asks
            raise AssertionError("read")

    win = LeakWindow({"config": {"x": 1}})
    buffers = {t: [id(col) for _, col in r.pairs] for t, r in win.rings.items()}
    sizes = {t: [len(col) for _, col in r.pairs] for t, r in win.rings.items()}
    n = 3 * KEEP_ROWS + 5
    for i in range(n):
        win.tap("steps", {"step": i + 7, "time": float(i), "tokens": Loud() if i % 2 else 64, "loss": 1.0})
        win.tap("memory", {"step": i + 7, "malloc_used_bytes": 1000 + i, "user_bytes": 5})
        win.tap("events", {"kind": "x"})
    win.tap("meta", {"preflight": {"a": 1}})
    assert win.error is None and win.first_step == 7.0
    assert win.meta == {"config": {"x": 1}, "preflight": {"a": 1}}
    mem, host, steps = win.columns()
    assert len(steps["step"]) == len(mem["step"]) == KEEP_ROWS and len(host["step"]) == 0
    assert np.array_equal(steps["step"], np.arange(n - KEEP_ROWS, n) + 7.0)  # the newest, oldest first
    odd = (steps["step"] - 7) % 2 == 1
    assert np.isnan(steps["tokens"][odd]).all() and (steps["tokens"][~odd] == 64).all()
    assert "loss" not in steps and "user_bytes" not in mem  # only what the rule reads
    assert {t: [id(col) for _, col in r.pairs] for t, r in win.rings.items()} == buffers  # nothing new made
    assert {t: [len(col) for _, col in r.pairs] for t, r in win.rings.items()} == sizes


def _looks(held: np.ndarray) -> int | None:
    """Tap one memory and one steps row a step into a window, judge it every LOOK_STEPS steps as the watch
    does; the step at which a leak is first named."""
    win = LeakWindow()
    for i, v in enumerate(held):
        win.tap("steps", {"step": i, "time": float(i), "tokens": 512})
        win.tap("memory", {"step": i, "malloc_used_bytes": float(v)})
        if i % LOOK_STEPS == LOOK_STEPS - 1:
            mem, host, steps = win.columns()
            if judge(mem, host, steps, first_step=win.first_step) is not None:
                return i
    return None


@pytest.mark.parametrize("flat", [50, 230, 500, 1500, 5000])
def test_a_leak_is_named_within_100_steps_of_its_start_wherever_it_starts(flat: int) -> None:
    rng = np.random.default_rng(flat)
    noise = rng.uniform(0, 512 * 1024, flat + 200)  # malloc's in-use bytes wobble between steps
    kept = 1.65e6 * np.clip(np.arange(flat + 200) - flat, 0, None)  # a validation loss kept with its graph
    held = 900 * MiB + noise + kept
    named = _looks(held)
    assert named is not None and flat < named <= flat + 100, named
    assert _looks(900 * MiB + noise) is None  # the same run without the leak: none


def test_the_whole_run_fact_judges_as_the_watch_does() -> None:
    """One judge: the rule on the run's frames (leak_of) and on the window's arrays say the same numbers."""
    import pandas as pd

    n, flat = 700, 500
    held = 900.0 * MiB + 1.65e6 * np.clip(np.arange(n) - flat, 0, None)
    win = LeakWindow()
    for i in range(n):
        win.tap("steps", {"step": i, "time": float(i)})
        win.tap("memory", {"step": i, "malloc_used_bytes": held[i]})
    mem, host, steps = win.columns()
    live = judge(mem, host, steps, first_step=win.first_step)
    whole = leak_of(pd.DataFrame({"step": np.arange(n), "malloc_used_bytes": held}), pd.DataFrame(),
                    pd.DataFrame({"step": np.arange(n), "time": np.arange(n, dtype=float)}), first_step=0)
    assert live is not None and live == whole and flat - 60 <= live.since_step <= flat


def test_leak_frames_are_typed_and_stored_as_before() -> None:
    lk = Leak(source="allocated_bytes", per_step_bytes=1.0, since_step=1, last_step=2, held_bytes=3.0,
              grown_bytes=4.0, frames=(LeakFrame("keep.py:7 main", 4096, 10, 40),))
    d = lk.as_dict()
    assert d["frames"] == [{"stack": "keep.py:7 main", "delta_bytes": 4096, "before_step": 10, "after_step": 40}]
    back = Leak.from_dict(d)
    assert back == lk and back is not None and back.frames[0].stack == "keep.py:7 main"


def test_a_watch_that_fails_says_so_once_and_takes_no_more_rows(tmp_path: Path) -> None:
    with Monitor(tmp_path / "r", host_hz=0, leak_poll_s=0.05, handle_signals=False) as m:
        watch = m._leaks
        watch.window.tap("meta", None)  # type: ignore[arg-type]  # something it cannot take (never raised)
        assert watch.window.error is not None
        for _ in range(3):
            with m.step():
                pass
        watch._thread.join(30.0)  # its next look finds the error and stops the watch
        assert not watch._thread.is_alive() and m.recorder.tap is None
    run = load_run(tmp_path / "r")
    try:
        assert str(run.meta.get("unavailable_leak_watch")).startswith("stopped after an error")
    finally:
        run.close()
