"""One background worker for the server's deferred work: a runs list answers from its runs' metadata and
asks this worker to summarise the rows it could not summarise at once (the next refresh shows them).

    summariser().ask(key, fn)   # fn() is run once, in order of asking; a key already waiting is not added again
    summariser().wait(timeout)  # until nothing waits or runs (tests, benchmarks); True when idle

A job that fails is dropped (the list asks again on its next refresh); the worker is a daemon thread,
started on the first ask, so a server that never defers anything starts none.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["Worker", "summariser"]


class Worker:
    """Runs the jobs it is asked, one at a time, oldest first, on one daemon thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: OrderedDict[Hashable, Callable[[], Any]] = OrderedDict()
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None

    def ask(self, key: Hashable, fn: Callable[[], Any]) -> None:
        with self._cond:
            if key in self._jobs:
                return
            self._jobs[key] = fn
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs) + int(self._busy)

    def wait(self, timeout: float | None = None) -> bool:
        """Until no job waits or runs (or ``timeout`` seconds); True when idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                _, fn = self._jobs.popitem(last=False)
                self._busy = True
            try:
                fn()
            except Exception:  # noqa: BLE001 - a failed summary is asked for again by the next listing
                pass
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


_WORKER = Worker("gpudash-summariser")


def summariser() -> Worker:
    """The process's worker that summarises runs for the runs list."""
    return _WORKER
