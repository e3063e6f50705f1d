"""The server's background worker (the runs list's deferred summaries): each key once while it waits, oldest
first, a failing job dropped without stopping the others."""

from __future__ import annotations

import threading

from gpudash.server.background import Worker


def test_jobs_run_once_each_in_order_and_a_failure_stops_nothing() -> None:
    worker = Worker("test-worker")
    gate = threading.Event()
    done: list[str] = []

    def first() -> None:
        gate.wait(30)
        done.append("first")

    def boom() -> None:
        raise RuntimeError("a damaged run")

    worker.ask("a", first)
    worker.ask("b", boom)
    worker.ask("c", lambda: done.append("c"))
    worker.ask("c", lambda: done.append("c again"))  # already waiting: not added twice
    assert worker.pending() == 3
    gate.set()
    assert worker.wait(30)
    assert done == ["first", "c"] and worker.pending() == 0
    worker.ask("c", lambda: done.append("c later"))  # done before: asked again, run again
    assert worker.wait(30) and done[-1] == "c later"
