"""GPU time per phase from CUDA events, resolved without ever waiting on the GPU.

The Monitor calls the timer (``monitor.cuda_timer``) at step and phase
boundaries; each call records a CUDA event on the current stream (a few µs,
asynchronous). The step's row is parked until its last event has completed;
a background thread polls ``Event.query()`` (non-blocking) and then adds
``<phase>_gpu_s`` (repeated phases add up) and ``gpu_s`` (step start to step
end on the GPU) and hands the row to ``monitor.put_step`` (the one writer of
the ``steps`` table). Rows go out in step order. If more than
``max_pending`` steps are in flight (the GPU is far behind, or stuck), the
oldest row is written without GPU times rather than holding memory. ``drain``
waits (polling, bounded) for the remaining events: only at flush and close.

Each timer call is wrapped so that a CUDA error here disables GPU timing
(recorded once) and never reaches the training loop; rows still get written.
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
    """Set as ``monitor.cuda_timer``; owns the rows of steps whose events are in flight."""

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

    # ---- training thread (called by the Monitor) ----------------------------------------
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

    def step_end(self, step: int, row: dict[str, Any]) -> None:
        start, pairs = self._start, self._pairs
        self._start, self._pairs = None, []
        self._open.clear()
        if not self.enabled or start is None:
            self._put(row)
            return
        try:
            end = self._event()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            self._put(row)
            return
        overflow: list[_Pending] = []
        with self._lock:
            self._pending.append(_Pending(row, start, end, pairs))
            while len(self._pending) > self.max_pending:
                overflow.append(self._pending.popleft())
        for p in overflow:
            self.dropped += 1
            self._put(p.row)

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
        self._stop.set()
        self._thread.join(5)
        self.drain()

    @property
    def pending(self) -> int:
        return len(self._pending)


class CudaTimingCollector:
    """Installs a :class:`CudaTimer` as ``monitor.cuda_timer`` when CUDA is available."""

    name = "cuda_timing"

    def __init__(self, **timer_options: Any) -> None:
        self.timer_options = timer_options
        self.timer: CudaTimer | None = None
        self._monitor: Recording | None = None

    def start(self, monitor: Recording) -> None:
        torch = cuda_torch(monitor, self.name, "no CUDA device: steps are timed on the CPU only")
        if torch is None:
            return
        self._monitor = monitor
        self.timer = CudaTimer(monitor, torch.cuda.Event, **self.timer_options)
        monitor.cuda_timer = self.timer

    def stop(self) -> None:
        timer, monitor = self.timer, self._monitor
        if timer is None or monitor is None:
            return
        timer.close()
        if monitor.cuda_timer is timer:
            monitor.cuda_timer = None
        self.timer = None
