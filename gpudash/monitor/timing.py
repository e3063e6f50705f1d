"""The step and phase timers: the code that runs on the training thread every step.

``with monitor.step():`` opens the step's row, runs the start hooks and takes
a timestamp; at exit it stamps ``step``/``time``/``duration_s`` and writes the
row through ``Monitor.put_step``; a step with end hooks, a due hook or a memory
record (``Monitor._slow_from``: one comparison) ends in ``Monitor.end_step``,
which runs them and writes the row unless an end hook took it (the CUDA timer
does: it hands the row on once its GPU times are known). ``with monitor.phase(name):`` adds
its wall time to ``<name>_s`` (nests and repeats add up) and runs the phase
hooks. Only timestamps and dict updates happen here: no I/O, no GPU sync.
A hook that raises is removed and its source recorded as unavailable.

Every step pays for these calls (issue 41: a few µs a step at most), so the path has no branch it can do
without: the row values go to is always a dict (:data:`NOWHERE`, which keeps nothing, between steps), and the
values logged between steps collect in a dict that becomes the next step's row as it is (no copy).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from gpudash.store.schema import column_name
from gpudash.store.steplog import mark_unpacked

if TYPE_CHECKING:
    from gpudash.collectors.api import PhaseEndHook, PhaseStartHook, StepEndHook, StepStartHook
    from gpudash.monitor.memory_rows import MemoryRow
    from gpudash.monitor.names import StoredNames
    from gpudash.store.writer import Recorder

__all__ = ["NEVER", "NOWHERE", "HookedPhase", "Phase", "Step", "innermost"]


class _Nowhere(dict):  # type: ignore[type-arg]
    """A row that keeps nothing: where a phase timed outside a step adds its time."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


#: A step no run reaches: when no ``end_due`` hook waits
NEVER = 1 << 62

#: The row between steps: a phase timed there (or a second exit of one step) records nothing.
NOWHERE: dict[str, Any] = _Nowhere()


class Monitor(Protocol):
    """What the timers use of :class:`gpudash.monitor.core.Monitor` (which imports this module)."""

    step_index: int
    recorder: Recorder
    _row: dict[str, Any]
    _pending: dict[str, Any]
    _into: dict[str, Any]
    _start_hooks: list[StepStartHook]
    _end_hooks: list[StepEndHook]
    _phase_start_hooks: list[PhaseStartHook]
    _phase_end_hooks: list[PhaseEndHook]
    _slow_from: int
    _names: StoredNames
    _memory: MemoryRow

    def put_step(self, row: dict[str, Any]) -> None: ...

    def _put_step(self, row: dict[str, Any]) -> None: ...

    def collector_failed(self, where: Any, exc: BaseException) -> None: ...

    def end_step(self, step: int, row: dict[str, Any]) -> None: ...

#: What a step's ``samples``/``tokens`` may be and its row still be packed (anything else marks it unpacked)
_PACKABLE = frozenset({int, float})
_perf = time.perf_counter
_time = time.time
#: Steps between two readings of the wall clock: a step's ``time`` is its end on ``perf_counter`` plus the
#: wall clock's offset from it, read again at every step whose number is a multiple of this (one clock call a
#: step saved; a wall clock set by hand or by NTP is followed within as many steps)
WALL_EVERY = 256
_WALL_MASK = WALL_EVERY - 1


def wall_offset() -> float:
    """``time.time() - time.perf_counter()``, read between two perf readings close together (a thread
    preempted between the two clocks' reads would shift every step's time by the wait: the closest of three
    tries, usually the first)."""
    best_gap, best = float("inf"), 0.0
    for _ in range(3):
        p0 = _perf()
        w = _time()
        p1 = _perf()
        if p1 - p0 < best_gap:
            best_gap, best = p1 - p0, w - (p0 + p1) / 2
        if best_gap < 1e-4:
            break
    return best


class Phase:
    """``monitor.phase(name)``: one per phase name, reused every time the phase opens. A run with no phase
    hooks (most) times its phases with this class: a clock reading in, one out, one dict store;
    :class:`HookedPhase` (the same object, its class switched by the Monitor) runs the hooks too."""

    __slots__ = ("_m", "name", "key", "_t0")

    def __init__(self, monitor: Monitor, name: str) -> None:
        self._m = monitor
        self.name = name
        self.key = column_name(f"{name}_s")
        self._t0 = 0.0

    @property
    def opened_at(self) -> float:
        """When the phase opened (``perf_counter``), 0.0 while it is closed."""
        return self._t0

    def __enter__(self) -> Phase:
        self._t0 = _perf()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        t1 = _perf()
        row = self._m._row  # (NOWHERE between steps)
        key = self.key
        if key in row:  # a phase opened again in the step adds up
            row[key] += t1 - self._t0
        else:
            row[key] = t1 - self._t0
        self._t0 = 0.0


class HookedPhase(Phase):
    """A phase of a Monitor with phase hooks: runs them as it opens and closes (the Monitor switches its phases'
    class when hooks come or go, so a run without hooks never looks at the lists)."""

    __slots__ = ()

    def __enter__(self) -> Phase:
        m = self._m
        for hook in m._phase_start_hooks:
            try:
                hook(self.name)
            except Exception as exc:  # noqa: BLE001 - a collector never breaks the loop
                m.collector_failed(hook, exc)
        self._t0 = _perf()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        t1 = _perf()
        m = self._m
        for hook in m._phase_end_hooks:
            try:
                hook(self.name)
            except Exception as exc:  # noqa: BLE001
                m.collector_failed(hook, exc)
        row = m._row
        key = self.key
        if key in row:
            row[key] += t1 - self._t0
        else:
            row[key] = t1 - self._t0
        self._t0 = 0.0


def innermost(phases: Iterable[Phase]) -> str | None:
    """The name of the innermost open phase of ``phases`` (the one opened last), None when none is open."""
    best, name = 0.0, None
    for ph in phases:
        t0 = ph.opened_at
        if t0 > best:
            best, name = t0, ph.name
    return name


class Step:
    """``monitor.step(...)``: the Monitor's one step context, reused every step."""

    __slots__ = ("_m", "samples", "tokens", "_t0", "_wall")

    def __init__(self, monitor: Monitor) -> None:
        self._m = monitor
        self.samples: Any = None
        self.tokens: Any = None
        self._t0 = 0.0
        self._wall = wall_offset()  # time.time() - time.perf_counter(), read again every WALL_EVERY steps

    def __enter__(self) -> Step:
        m = self._m
        # what was logged since the last step is this step's row as it stands: no copy
        row = m._pending
        m._pending = {}
        m._row = m._into = row
        if m._start_hooks:
            step = m.step_index
            for hook in m._start_hooks:
                try:
                    hook(step)
                except Exception as exc:  # noqa: BLE001 - a collector never breaks the loop
                    m.collector_failed(hook, exc)
        self._t0 = _perf()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        t1 = _perf()
        m = self._m
        row = m._row
        if row is NOWHERE:  # (exited twice)
            return
        m._row = NOWHERE
        m._into = m._pending
        step = m.step_index
        if "step" in row or "time" in row or "duration_s" in row:  # logged under a name of ours
            m._names.rename_own(row)
        row["step"] = step
        if not step & _WALL_MASK:
            self._wall = wall_offset()
        row["time"] = t1 + self._wall
        row["duration_s"] = t1 - self._t0
        samples, tokens = self.samples, self.tokens
        if samples is not None:
            row["samples"] = samples
            if samples.__class__ not in _PACKABLE:  # (a tensor: see gpudash.store.steplog)
                mark_unpacked(row)
        if tokens is not None:
            row["tokens"] = tokens
            if tokens.__class__ not in _PACKABLE:
                mark_unpacked(row)
        if et is not None:
            # a failed step (e.g. an OOM the trainer will retry) is not a step;
            # the caller records what happened. Undo sampling state.
            for hook in m._end_hooks:
                try:
                    hook(step, {"step": step, "time": row["time"], "duration_s": row["duration_s"], "failed": 1})
                except Exception as exc:  # noqa: BLE001
                    m.collector_failed(hook, exc)
            m._memory.discard()
            return
        if step >= m._slow_from:  # end hooks, a due hook, a memory record (most steps have none)
            m.end_step(step, row)
        else:
            m._put_step(row)
        m.step_index = step + 1
