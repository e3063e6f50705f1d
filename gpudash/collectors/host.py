"""Host CPU and memory of the training process, sampled by psutil in a daemon thread."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["HostCollector"]


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
        period = 1.0 / self.hz

        def sample() -> None:
            while True:
                try:
                    with proc.oneshot():
                        mem = proc.memory_info()
                        row = {
                            "time": time.time(),
                            "cpu_pct": proc.cpu_percent(None),
                            "rss_bytes": mem.rss,
                            "threads": proc.num_threads(),
                        }
                    vm = psutil.virtual_memory()
                    row["system_cpu_pct"] = psutil.cpu_percent(None)
                    row["available_bytes"] = vm.available
                    row["total_bytes"] = vm.total
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
