"""Host CPU and memory of the training process, sampled by psutil in a daemon thread.

Beside the RSS, where the C library is glibc, ``malloc_used_bytes``: the bytes malloc has handed out and
not had back (``mallinfo2``: in-use heap chunks plus mmapped ones). On CPU it is what the process holds,
without the pages malloc keeps for reuse or loses to fragmentation (measured on a loop that keeps 531 KiB
of tensors a step: RSS grew 774 KiB a step, malloc's in-use bytes 543 KiB), so the leak rule reads it first.

Memory held *between steps* is read where it is defined, at step boundaries on the training thread (a timer
lands anywhere inside a step, and how many samples a run gets depends on how loaded the machine is): at the end
of a step :class:`HeldSampler` adds malloc's in-use bytes to the step's memory row as ``malloc_used_bytes``.
``mallinfo2`` costs tens to hundreds of µs (it walks the free lists), so it runs every ``every`` steps, ``every``
chosen from its own measured cost so that it stays under :data:`HELD_BUDGET` of the step time and never above
:data:`HELD_MAX_EVERY`; steps without a sample pay one comparison. The leak rule judges these rows: a leak is
found by steps, however slowly a timer would have fired.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["HELD_BUDGET", "HELD_MAX_EVERY", "HeldSampler", "HostCollector", "malloc_used"]

HELD_BUDGET = 0.01
"""Share of the step time the step-boundary malloc sample may cost (its own measured time): on steps of a few
ms or more (any step that keeps 1 MiB of tensors) every step is sampled."""
HELD_MAX_EVERY = 1000
"""Steps between two step-boundary samples at most (a loop of µs steps is still sampled now and then)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_used() -> Callable[[], int] | None:
    """A function returning malloc's in-use bytes (glibc >= 2.33's ``mallinfo2``), or None elsewhere.
    It takes malloc's arena locks for as long as it walks the free lists (tens to hundreds of µs):
    called from the sampling thread only, once per sample."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []

    def used() -> int:
        m = fn()
        return int(m.uordblks + m.hblkhd)
    return used


class HeldSampler:
    """Malloc's in-use bytes at step ends, into the step's memory row (an end hook on the training thread).
    Which steps are sampled adapts to the cost; what a sample reads is the step boundary's value."""

    name = "host_held"
    __slots__ = ("_in_use", "_monitor", "cost", "every", "next")

    def __init__(self, in_use: Callable[[], int], monitor: Recording) -> None:
        self._in_use = in_use
        self._monitor = monitor
        self.next = 0
        self.every = 1
        self.cost = 0.0

    def on_step_end(self, step: int, row: dict[str, Any]) -> int:
        """A sample at the end of ``step`` (an ``end_due`` hook: the Monitor calls it at the steps it asks for,
        never at a failed one); returns the next step to sample."""
        t0 = time.perf_counter()
        used = self._in_use()
        cost = time.perf_counter() - t0
        self._monitor.memory_row(step, {"malloc_used_bytes": used})
        # the cost it is budgeted by: a sample the thread was preempted in raises it by a tenth at most
        self.cost = cost if not self.cost else min(cost, 1.1 * self.cost)
        dur = float(row.get("duration_s") or 0.0)
        self.every = (min(HELD_MAX_EVERY, max(1, math.ceil(self.cost / (HELD_BUDGET * dur)))) if dur > 0
                      else HELD_MAX_EVERY)
        self.next = step + self.every
        return self.next


class HostCollector:
    name = "host"

    def __init__(self, hz: float = 1.0) -> None:
        self.hz = hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held: HeldSampler | None = None

    def start(self, monitor: Recording) -> None:
        try:
            import psutil
        except ImportError:
            monitor.unavailable("host", "psutil is not installed (pip install psutil)")
            return
        proc = psutil.Process()
        proc.cpu_percent(None)  # first call primes the counter
        psutil.cpu_percent(None)
        put = monitor.put
        in_use = malloc_used()
        period = 1.0 / self.hz
        if in_use is not None:
            self.held = HeldSampler(in_use, monitor)
            monitor.add_step_hooks(end_due=self.held.on_step_end)
        from gpudash.collectors.procmem import ProcMem, open_pinned
        from gpudash.collectors.rapl import open_rapl
        by_process = ProcMem(proc)
        pinned, no_pinned = open_pinned()
        if pinned is None:
            monitor.unavailable("pinned_memory", no_pinned or "pinned memory not measured")
        rapl, no_rapl = open_rapl()
        if rapl is None:
            monitor.unavailable("cpu_energy", no_rapl or "no RAPL counters")

        def sample() -> None:
            nonlocal pinned
            while True:
                try:
                    with proc.oneshot():
                        mem = proc.memory_info()
                        row = {
                            "time": time.time(),
                            # the step the sample falls in: the leak rule places RSS at steps (CPU has no allocator)
                            "step": monitor.step_index,
                            "cpu_pct": proc.cpu_percent(None),
                            "rss_bytes": mem.rss,
                            "threads": proc.num_threads(),
                        }
                    if in_use is not None:
                        row["malloc_used_bytes"] = in_use()
                    vm = psutil.virtual_memory()
                    row["system_cpu_pct"] = psutil.cpu_percent(None)
                    row["available_bytes"] = vm.available
                    row["total_bytes"] = vm.total
                    row.update(by_process.sample())
                    if rapl is not None:
                        row["cpu_energy_j"] = rapl.read()
                    if pinned is not None:
                        try:
                            row.update(pinned())
                        except Exception as exc:  # noqa: BLE001 - recorded once; the other columns go on
                            monitor.unavailable("pinned_memory", f"torch.cuda.host_memory_stats failed: {exc}")
                            pinned = None
                    if by_process.unavailable is not None:  # recorded once; the other columns go on
                        monitor.unavailable("host_by_process", by_process.unavailable)
                    put("host", row)
                except Exception as exc:  # noqa: BLE001 - never kill the sampler silently
                    monitor.unavailable("host", f"psutil failed: {exc}")
                    return
                if self._stop.wait(period):
                    return

        self._thread = threading.Thread(target=sample, name="gpudash-host", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
