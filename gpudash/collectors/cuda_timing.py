"""GPU time per phase from CUDA events, resolved without ever waiting on the GPU.

The timer is an ordinary set of step hooks (``monitor.add_step_hooks``: step
start and end, phase start and end); each records a CUDA event on the current
stream (a few µs, asynchronous). Its step-end hook holds the step's row (it
returns True, so the Monitor does not write it) until its last event has completed;
a background thread polls ``Event.query()`` (non-blocking) and then adds
``<phase>_gpu_s`` (repeated phases add up) and ``gpu_s`` (step start to step
end on the GPU) and hands the row to ``monitor.put_step`` (the one writer of
the ``steps`` table). Rows go out in step order. If more than
``max_pending`` steps are in flight (the GPU is far behind, or stuck), the
oldest row is written without GPU times rather than holding memory. ``drain``
waits (polling, bounded) for the remaining events: only at flush and close,
which reach it as they reach every collector (``drain`` and ``stop``).

Each timer call is wrapped so that a CUDA error here disables GPU timing
(recorded once) and never reaches the training loop; rows still get written
(the hooks stop holding them, so the Monitor writes them itself).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from gpudash.collectors.base import cuda_torch
from gpudash.store.schema import column_name

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["CudaTimer", "CudaTimingCollector"]


class _Pending:
    __slots__ = ("row", "start", "end", "pairs")

    def __init__(self, row: dict[str, Any], start: Any, end: Any, pairs: list[tuple[str, Any, Any]]) -> None:
        self.row = row
        self.start = start
        self.end = end
        self.pairs = pairs


class CudaTimer:
    """Owns the rows of steps whose events are in flight; :meth:`attach` registers its hooks."""

    name = "cuda_timing"  # what a failing hook is recorded as

    def __init__(self, monitor: Recording, event_cls: Any, *, max_pending: int = 256,
                 poll_interval: float = 0.05) -> None:
        """``event_cls``: ``torch.cuda.Event`` (anything with ``record``, ``query``,
        and ``elapsed_time`` in ms)."""
        self.monitor = monitor
        self._event_cls = event_cls
        self.max_pending = max_pending
        self.poll_interval = poll_interval
        self.enabled = True
        self.dropped = 0
        self._free: list[Any] = []
        self._start: Any = None
        self._open: dict[str, list[Any]] = {}
        self._pairs: list[tuple[str, Any, Any]] = []
        self._pending: deque[_Pending] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudash-cuda-timer", daemon=True)
        self._thread.start()

    def attach(self) -> None:
        """Register the timer's step and phase hooks on its monitor."""
        self.monitor.add_step_hooks(start=self.step_start, end=self.step_end,
                                    phase_start=self.phase_start, phase_end=self.phase_end)

    # ---- training thread (the Monitor's step and phase hooks) ---------------------------
    def _event(self) -> Any:
        with self._lock:
            ev = self._free.pop() if self._free else None
        if ev is None:
            ev = self._event_cls(enable_timing=True)
        ev.record()
        return ev

    def _fail(self, exc: BaseException) -> None:
        self.enabled = False
        self.monitor.unavailable("cuda_timing", f"stopped after a CUDA error: {type(exc).__name__}: {exc}")

    def step_start(self, step: int) -> None:
        if not self.enabled:
            return
        self._open.clear()
        self._pairs = []
        try:
            self._start = self._event()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def phase_start(self, name: str) -> None:
        if not self.enabled or self._start is None:
            return
        try:
            self._open.setdefault(name, []).append(self._event())
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def phase_end(self, name: str) -> None:
        if not self.enabled or self._start is None:
            return
        starts = self._open.get(name)
        if not starts:
            return
        try:
            self._pairs.append((name, starts.pop(), self._event()))
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def step_end(self, step: int, row: dict[str, Any]) -> bool:
        """True: the row is held here until its GPU times are known (False: the Monitor writes it)."""
        start, pairs = self._start, self._pairs
        self._start, self._pairs = None, []
        self._open.clear()
        if not self.enabled or start is None or row.get("failed"):
            return False
        try:
            end = self._event()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return False
        overflow: list[_Pending] = []
        with self._lock:
            self._pending.append(_Pending(row, start, end, pairs))
            while len(self._pending) > self.max_pending:
                overflow.append(self._pending.popleft())
        for p in overflow:
            self.dropped += 1
            self._put(p.row)
        return True

    # ---- resolution (collector thread, and drain at close) ------------------------------
    def _put(self, row: dict[str, Any]) -> None:
        self.monitor.put_step(row)

    def _resolve(self, p: _Pending) -> None:
        row = p.row
        try:
            row["gpu_s"] = p.start.elapsed_time(p.end) / 1e3
            for name, a, b in p.pairs:
                key = column_name(f"{name}_gpu_s")
                row[key] = row.get(key, 0.0) + a.elapsed_time(b) / 1e3
        except Exception as exc:  # noqa: BLE001 - a bad event loses the GPU times, not the row
            self._fail(exc)
        self._put(row)
        with self._lock:
            self._free.append(p.start)
            self._free.append(p.end)
            for _, a, b in p.pairs:
                self._free.append(a)
                self._free.append(b)
            del self._free[4 * self.max_pending:]

    def poll(self) -> int:
        """Resolve every leading step whose events have completed; never blocks."""
        done = 0
        while True:
            with self._lock:
                if not self._pending:
                    return done
                head = self._pending[0]
            try:
                ready = bool(head.end.query())
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                ready = True
            if not ready:
                return done
            with self._lock:
                if self._pending and self._pending[0] is head:
                    self._pending.popleft()
                else:
                    continue
            self._resolve(head)
            done += 1

    def drain(self, timeout: float = 10.0) -> None:
        """Wait (polling, at most ``timeout`` s) for every step in flight and write its row;
        rows whose events never complete (a hung GPU) are written without GPU times."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._pending:
                    return
                head = self._pending[0]
            try:
                ready = bool(head.end.query())
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                ready = True
            if not ready and time.monotonic() < deadline:
                time.sleep(0.001)
                continue
            with self._lock:
                if not self._pending or self._pending[0] is not head:
                    continue
                self._pending.popleft()
            if ready:
                self._resolve(head)
            else:
                self.dropped += 1
                self._put(head.row)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - keep rows flowing even if timing breaks
                self._fail(exc)

    def close(self) -> None:
        """Stop polling and write every row still held; later steps are not timed (their hooks hold nothing)."""
        self.enabled = False
        self._stop.set()
        self._thread.join(5)
        self.drain()

    @property
    def pending(self) -> int:
        return len(self._pending)


class CudaTimingCollector:
    """Attaches a :class:`CudaTimer` (its step hooks) when CUDA is available.

    ``event_cls``: the event class to time with (default ``torch.cuda.Event``; tests pass a host
    stand-in, which also skips the CUDA check). Other options go to :class:`CudaTimer`."""

    name = "cuda_timing"

    def __init__(self, event_cls: Any = None, **timer_options: Any) -> None:
        self.event_cls = event_cls
        self.timer_options = timer_options
        self.timer: CudaTimer | None = None

    def start(self, monitor: Recording) -> None:
        event_cls = self.event_cls
        if event_cls is None:
            torch = cuda_torch(monitor, self.name, "no CUDA device: steps are timed on the CPU only")
            if torch is None:
                return
            event_cls = torch.cuda.Event
        self.timer = CudaTimer(monitor, event_cls, **self.timer_options)
        self.timer.attach()

    def drain(self) -> None:
        """Write the rows whose GPU times are still in flight (``Monitor.flush``; waits, bounded)."""
        if self.timer is not None:
            self.timer.drain()

    def stop(self) -> None:
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.close()
