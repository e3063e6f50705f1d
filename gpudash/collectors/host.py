"""Host CPU and memory of the training process, sampled by psutil in a daemon thread.

Beside the RSS, where the C library is glibc, ``malloc_used_bytes``: the bytes malloc has handed out and
not had back (``mallinfo2``: in-use heap chunks plus mmapped ones). On CPU it is what the process holds,
without the pages malloc keeps for reuse or loses to fragmentation (measured on a loop that keeps 531 KiB
of tensors a step: RSS grew 774 KiB a step, malloc's in-use bytes 543 KiB), so the leak rule reads it first.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["HostCollector", "malloc_used"]


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


class HostCollector:
    name = "host"

    def __init__(self, hz: float = 1.0) -> None:
        self.hz = hz
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        from gpudash.collectors.procmem import ProcMem
        from gpudash.collectors.rapl import open_rapl
        by_process = ProcMem(proc)
        rapl, no_rapl = open_rapl()
        if rapl is None:
            monitor.unavailable("cpu_energy", no_rapl or "no RAPL counters")

        def sample() -> None:
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
