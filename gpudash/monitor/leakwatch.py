"""The leak watch: while the run goes, the leak rule (:func:`gpudash.analysis.leak.leak_of`) on this rank's
trailing rows, and a ``leak`` event recorded once per episode.

A daemon thread reads the rows this rank recorded since its last look (memory, host, steps: the same rows
every surface reads, from the run directory), keeps the newest :data:`KEEP_ROWS` of each, and judges them
every ``poll_s`` (the writer flushed first), and sooner by steps: once :data:`LOOK_STEPS` steps have passed since the last look (but not
more often than every :data:`MIN_LOOK_S`, nor than :data:`LOOK_SHARE` of its own time allows), so a fast leak is
named within a hundred steps of its start however long ``poll_s`` is. Nothing touches the training thread but the GIL share of a few small SQLite reads and
one judge of a few thousand numbers per look; a failure stops the watch (said once), never the run.

On GPU the cause is looked for in the allocator: once the run is past its warm-up the watch asks the
snapshot collector for one snapshot (the "before"), and when a leak is first suspected for another; the
event then carries the stacks whose live bytes grew between the two (the snapshot diff). At most
:data:`MAX_SNAPSHOTS` snapshots are asked for in a run, and a leak waits at most :data:`SNAPSHOT_WAIT_LOOKS`
looks for its snapshot before it is recorded without frames.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace
from typing import Any

import pandas as pd

from gpudash.analysis.capacity import capacity_bytes
from gpudash.analysis.leak import LEAK_EVENT, WARMUP_STEPS, Leak, leak_of, leak_text
from gpudash.store.rankreader import RankReader

__all__ = ["KEEP_ROWS", "LOOK_STEPS", "MAX_EPISODES", "MAX_SNAPSHOTS", "MIN_LOOK_S", "LeakWatch"]

KEEP_ROWS = 4096
"""Rows of each table (memory, host, steps) the trailing window keeps."""
MAX_EPISODES = 10
"""Leak events one run records at most."""
MAX_SNAPSHOTS = 4
"""Snapshots the watch asks for in one run at most (a "before" and one per suspected leak)."""
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
"""How often the thread checks the step count (reads one int: nothing on the training thread)."""
_TABLES = ("memory", "host", "steps")
_KEPT = {"steps": frozenset({"step", "time", "attempt", "tokens", "samples"}),
         "host": frozenset({"step", "time", "attempt", "malloc_used_bytes", "rss_bytes", "available_bytes",
                            "total_bytes"})}
"""The columns the leak rule reads (memory: step, time, attempt and every ``*_bytes``): the window keeps no
other, so what the watch holds grows by a few numbers a step until it is full, not by whole rows (the steps'
scalars, the host's per-process columns)."""


def _kept(table: str, column: str) -> bool:
    kept = _KEPT.get(table)
    if kept is None:
        return column in ("step", "time", "attempt") or column.endswith("_bytes")
    return column in kept


class LeakWatch:
    """This rank's leak watch (a daemon thread); ``monitor`` records the events and owns the snapshots."""

    def __init__(self, monitor: Any, poll_s: float) -> None:
        self.monitor = monitor
        self.poll_s = poll_s
        self.rows: dict[str, deque[tuple[Any, ...]]] = {t: deque(maxlen=KEEP_ROWS) for t in _TABLES}
        self.columns: dict[str, list[str]] = {t: [] for t in _TABLES}
        self.cursor = {t: 0 for t in _TABLES}
        self.first_step: float | None = None
        self.found: list[Leak] = []
        self._reader: RankReader | None = None
        self._active = False
        self._quiet = 0
        self._pending: tuple[int, int] | None = None
        self._asked = 0
        self._before_step: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpudash-leak", daemon=True)
        self._thread.start()

    # ---- reading ------------------------------------------------------------------------------------
    def _rank(self) -> RankReader | None:
        """This rank's own database (never the other ranks': a reader left open on a finished rank's file
        would keep its log files)."""
        if self._reader is None:
            try:
                self._reader = RankReader(self.monitor.recorder.live_path)
            except Exception:  # noqa: BLE001 - nothing written yet: the next look tries again
                return None
        return self._reader

    def _read_new(self) -> bool:
        r = self._rank()
        if r is None:
            return False
        r.refresh_columns()
        new = False
        for t in _TABLES:
            if r.max_rowid(t) <= self.cursor[t]:
                continue
            cols, rows = r.read_rows(t, after_rowid=self.cursor[t], limit=20_000)
            if not rows:
                continue
            self.cursor[t] = int(rows[-1][0])
            keep = [i for i, c in enumerate(cols) if _kept(t, c)]
            if len(keep) < len(cols):
                cols = [cols[i] for i in keep]
                rows = [(row[0], *[row[i + 1] for i in keep]) for row in rows]
            if cols != self.columns[t]:  # a column recorded for the first time: older rows get None there
                old = self.columns[t]
                self.rows[t] = deque((tuple(dict(zip(["_rowid", *old], row, strict=True)).get(c)
                                            for c in ["_rowid", *cols]) for row in self.rows[t]), maxlen=KEEP_ROWS)
                self.columns[t] = cols
            self.rows[t].extend(rows)
            new = True
        return new

    def frame(self, table: str) -> pd.DataFrame:
        return pd.DataFrame.from_records(list(self.rows[table]), columns=["_rowid", *self.columns[table]])

    # ---- judging ------------------------------------------------------------------------------------
    def _capacity(self, mem: pd.DataFrame) -> float | None:
        return capacity_bytes(r.meta() if (r := self._rank()) is not None else {}, mem)  # the whole-run fact's

    def look(self) -> Leak | None:
        """One look: read what is new, judge it, record an event when a new episode begins."""
        if not self._read_new():
            return None
        steps = self.frame("steps")
        if self.first_step is None and len(steps) and "step" in steps:
            self.first_step = float(pd.to_numeric(steps["step"], errors="coerce").min())
        mem, host = self.frame("memory"), self.frame("host")
        on_gpu = "allocated_bytes" in mem and mem["allocated_bytes"].notna().any()
        if on_gpu and self._before_step is None and self.monitor.step_index >= 2 * WARMUP_STEPS:
            self._before_step = self.monitor.step_index
            self._snapshot()  # the "before" a later leak's diff starts from
        rank = self.monitor.rank if self.monitor.world_size > 1 else None
        leak = leak_of(mem, host, steps, capacity=self._capacity(mem), rank=rank, first_step=self.first_step)
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
        col.request()
        return True

    def _frames(self, since: int) -> list[dict[str, Any]] | None:
        """The stacks that grew from the "before" snapshot to the first one taken at ``since`` or after; None
        while that one is not stored yet."""
        from gpudash.analysis.snapshot_diff import snapshot_diff
        from gpudash.store.snapshot import snapshots_from_frame

        r = self._rank()
        if r is None or not r.has_table("snapshots"):
            return None
        maps = snapshots_from_frame(r.read("snapshots"), [])
        after = next((m for m in maps if m.step is not None and m.step >= since), None)
        before = next((m for m in reversed(maps) if m.step is not None and m.step < since), None)
        if after is None:
            return None
        if before is None:
            return []
        diff = snapshot_diff(before, after, top=TOP_FRAMES)
        return [{"stack": c.stack, "delta_bytes": c.delta_bytes, "before_step": before.step,
                 "after_step": after.step} for c in diff.rows if c.delta_bytes > 0]

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
        while not self._stop.wait(min(self.poll_s, _TICK_S)):
            now = time.monotonic()
            if not self._due(now, last, last_step, cost):
                continue
            last, last_step = now, self.monitor.step_index
            try:
                # the rows written so far reach the file first (the writer's own flush waits up to
                # flush_interval: tens of fast steps a look would not see); this thread waits, not training's
                self.monitor.recorder.flush(1.0)
                t0 = time.thread_time()
                self.look()
            except Exception as exc:  # noqa: BLE001 - the watch stops; training goes on
                self.monitor.unavailable("leak_watch", f"stopped after an error: {type(exc).__name__}: {exc}")
                return
            cost = time.thread_time() - t0  # the judging's own CPU, not the wait for the writer or a busy machine

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        if self._reader is not None:
            self._reader.close()
            self._reader = None
