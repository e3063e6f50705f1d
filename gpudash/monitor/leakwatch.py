"""The leak watch: while the run goes, the leak rule (:func:`gpudash.analysis.leak_rule.judge`) on this rank's
newest rows, and a ``leak`` event recorded once per episode.

The rows come in-process: the recorder hands each row it queues to the watch's window
(:class:`gpudash.monitor.leakwindow.LeakWindow`, fixed rings of the few numbers the rule reads, made with the
watch), so nothing is read back from the run's file and nothing waits for the writer. A daemon thread judges the
window every ``poll_s``, and sooner by steps: once :data:`LOOK_STEPS` steps have passed since the last look (but
not more often than every :data:`MIN_LOOK_S`, nor than :data:`LOOK_SHARE` of its own time allows), so a fast leak
is named within a hundred steps of its start however long ``poll_s`` is. Everything the watch keeps is made when
it starts (the window, and the judge's first run on a made-up window, before the first step), so what the
watched process holds does not grow with the watch's looks. Nothing touches the training thread but the tap (a
few numbers copied a row) and the GIL share of one judge of a few thousand numbers per look; a failure stops the
watch (said once), never the run.

On GPU the cause is looked for in the allocator: once the run is past its warm-up the watch asks the
snapshot collector for one snapshot (the "before"), and when a leak is first suspected for another; the
event then carries the stacks whose live bytes grew between the two (the snapshot diff of the rows the
window kept as the recorder queued them: no flush, no read-back), stored with reason :data:`SNAPSHOT_REASON`
(``"requested"`` is a user's request from the dashboard). At most :data:`MAX_SNAPSHOTS` snapshots are asked for in a run, and a leak waits at most
:data:`SNAPSHOT_WAIT_LOOKS` looks for its snapshot before it is recorded without frames.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np

from gpudash.analysis.leak_rule import LEAK_EVENT, WARMUP_STEPS, Columns, Leak, LeakFrame, judge, leak_text
from gpudash.monitor.leakwindow import KEEP_ROWS, SNAPSHOT_REASON, LeakWindow

__all__ = ["KEEP_ROWS", "LOOK_STEPS", "MAX_EPISODES", "MAX_SNAPSHOTS", "MIN_LOOK_S", "SNAPSHOT_REASON", "LeakWatch"]

MAX_EPISODES = 10
"""Leak events one run records at most."""
MAX_SNAPSHOTS = 4
"""Snapshots the watch asks for in one run at most (a "before" and one per suspected leak)."""
"""The reason the snapshots the watch asks for (its "before" and "after") are stored with."""
SNAPSHOT_WAIT_LOOKS = 3
"""Looks a found leak waits for its snapshot before it is recorded without frames."""
QUIET_LOOKS = 3
"""Looks in a row that find no leak end an episode (a later leak is a new one)."""
TOP_FRAMES = 5
LOOK_STEPS = 16
"""Steps after which the watch looks again without waiting for ``poll_s``."""
MIN_LOOK_S = 0.2
"""Seconds between two looks at least (a loop of ms steps is not judged every 16 steps)."""
LOOK_SHARE = 0.02
"""A look's own CPU time is at most this share of the time between looks (it holds the GIL while it judges)."""
_TICK_S = 0.1
"""How often at most the thread checks the step count and copies the numbers of the rows handed over since (so the
rows it holds by reference stay a tick's worth, not a look's; nothing on the training thread). It also does so as
soon as the writer has drained its queue (``Recorder.drained``): the window then holds a row no longer than the
writer's queue does, so what the watch adds to the watched process's memory is nothing beyond the queue's."""


def _warm() -> None:
    """The judge once on a made-up leak (numpy's first calls make what they keep: before the steps, not in them)."""
    steps = np.arange(200.0)
    held = 1e9 + 2**20 * steps
    judge({"step": steps, "malloc_used_bytes": held}, {"available_bytes": np.array([1e10])},
          {"step": steps, "tokens": np.full(200, 64.0)}, first_step=0.0)


class LeakWatch:
    """This rank's leak watch (a daemon thread); ``monitor`` records the events and owns the snapshots."""

    def __init__(self, monitor: Any, poll_s: float) -> None:
        self.monitor = monitor
        self.poll_s = poll_s
        recorder = monitor.recorder
        self.window = LeakWindow(getattr(recorder, "start_meta", None))
        self.found: list[Leak] = []
        self._seen = 0
        self._active = False
        self._quiet = 0
        self._pending: tuple[int, int] | None = None
        self._asked = 0
        self._before_step: int | None = None
        _warm()
        recorder.tap = self.window.tap
        steps = getattr(recorder, "steps", None)
        if steps is not None:
            self.window.follow(steps)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpudash-leak", daemon=True)
        self._thread.start()

    # ---- judging ------------------------------------------------------------------------------------
    def _capacity(self, mem: Columns) -> float | None:
        """The whole-run fact's capacity, from the meta set so far and the memory rows' device total. The
        window's columns as they are: no pandas (a training process that never imported it would on the first
        look: 0.35 s of the watch's CPU holding the GIL, where the looks after take 2-3 ms)."""
        from gpudash.analysis.capacity import MEMORY_COLUMNS, capacity_bytes

        return capacity_bytes(self.window.meta, {c: mem[c] for c in MEMORY_COLUMNS if c in mem})

    def look(self) -> Leak | None:
        """One look: judge the window when it holds new rows, record an event when a new episode begins."""
        win = self.window
        if win.error is not None:
            raise RuntimeError(f"its window stopped taking rows ({win.error})")
        seen = win.rows
        if seen == self._seen:
            return None
        self._seen = seen
        mem, host, steps = win.columns()
        alloc = mem.get("allocated_bytes")
        on_gpu = alloc is not None and not np.isnan(alloc).all()
        if on_gpu and self._before_step is None and self.monitor.step_index >= 2 * WARMUP_STEPS:
            self._before_step = self.monitor.step_index
            self._snapshot()  # the "before" a later leak's diff starts from
        rank = self.monitor.rank if self.monitor.world_size > 1 else None
        leak = judge(mem, host, steps, capacity=self._capacity(mem) if on_gpu else None, rank=rank,
                     first_step=win.first_step)
        if leak is None:
            self._quiet += 1
            if self._quiet >= QUIET_LOOKS:
                self._active = False
            return None
        self._quiet = 0
        if self._active or len(self.found) >= MAX_EPISODES:
            return None
        if self._pending is None:
            if on_gpu and self._snapshot():  # the "after": the event waits for it (a few looks at most)
                self._pending = (self.monitor.step_index, 0)
                return None
            return self._record(leak)
        step, looks = self._pending
        frames = self._frames(step)
        if frames is None and looks < SNAPSHOT_WAIT_LOOKS:
            self._pending = (step, looks + 1)
            return None
        self._pending = None
        # the rows diffed are let go but the newest (a later episode's "before"): the window holds no more than
        # two snapshots' compressed summaries between episodes
        del self.window.snapshots[:-1]
        return self._record(replace(leak, frames=tuple(frames or ())))

    def _snapshot(self) -> bool:
        """Ask the snapshot collector for one at the end of the current step (bounded)."""
        if self._asked >= MAX_SNAPSHOTS:
            return False
        col = next((c for c in self.monitor.collectors if getattr(c, "name", "") == "snapshots"
                    and getattr(c, "can_take", False)), None)  # one that can take them (CUDA, or a test's)
        if col is None:
            return False
        self._asked += 1
        col.request(SNAPSHOT_REASON)
        return True

    def _frames(self, since: int) -> list[LeakFrame] | None:
        """The stacks that grew from the watch's "before" snapshot to its first one taken at ``since`` or after;
        None while that one is not recorded yet. The rows come from the window (in-process, as the recorder
        queued them): no flush waited for, nothing read back from the run's file (on the H200 the flush and
        read-back put the event ~1 s after the leak was found, the end of a run of 2 ms steps)."""
        import pandas as pd

        from gpudash.analysis.snapshot_diff import snapshot_diff
        from gpudash.store.snapshot import snapshots_from_frame

        rows = list(self.window.snapshots)
        if not rows:
            return None
        maps = snapshots_from_frame(pd.DataFrame(rows), [])
        after = next((m for m in maps if m.step is not None and m.step >= since), None)
        before = next((m for m in reversed(maps) if m.step is not None and m.step < since), None)
        if after is None:
            return None
        if before is None:
            return []
        diff = snapshot_diff(before, after, top=TOP_FRAMES)
        return [LeakFrame(stack=c.stack, delta_bytes=int(c.delta_bytes), before_step=before.step,
                          after_step=after.step) for c in diff.rows if c.delta_bytes > 0]

    def _record(self, leak: Leak) -> Leak:
        if leak.source == "allocated_bytes" and not leak.frames:
            leak = replace(leak, seen=leak.seen + "; no frames: the snapshots hold no allocation history (pass "
                                                  "--snapshot-every N to record it) or none was taken before")
        self._active = True
        self.found.append(leak)
        self.monitor.event(LEAK_EVENT, leak_text(leak), **leak.as_dict())
        return leak

    # ---- the thread ---------------------------------------------------------------------------------
    def _due(self, now: float, last: float, last_step: int, cost: float) -> bool:
        waited = now - last
        if waited >= self.poll_s:
            return True
        return (self.monitor.step_index - last_step >= LOOK_STEPS and waited >= MIN_LOOK_S
                and waited * LOOK_SHARE >= cost)

    def _loop(self) -> None:
        last, last_step, cost = time.monotonic(), 0, 0.0
        drained = self.monitor.recorder.drained
        while True:
            drained.wait(min(self.poll_s, _TICK_S))
            drained.clear()
            if self._stop.is_set():
                return
            try:
                self.window.take()
            except Exception as exc:  # noqa: BLE001 - the watch stops; training goes on
                self._untap()
                self.monitor.unavailable("leak_watch", f"stopped after an error: {type(exc).__name__}: {exc}")
                return
            now = time.monotonic()
            if not self._due(now, last, last_step, cost):
                continue
            last, last_step = now, self.monitor.step_index
            try:
                t0 = time.thread_time()
                self.look()
            except Exception as exc:  # noqa: BLE001 - the watch stops; training goes on
                self._untap()
                self.monitor.unavailable("leak_watch", f"stopped after an error: {type(exc).__name__}: {exc}")
                return
            cost = time.thread_time() - t0  # the judging's own CPU, not the wait for the writer or a busy machine

    def _untap(self) -> None:
        """The recorder hands this watch no more rows."""
        recorder = self.monitor.recorder
        if recorder.tap == self.window.tap:
            recorder.tap = None
        self.window.unfollow()

    def stop(self) -> None:
        self._untap()
        self._stop.set()
        self.monitor.recorder.drained.set()  # the thread waits on it: wake it to stop
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
