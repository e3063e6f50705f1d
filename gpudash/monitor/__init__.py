"""The Monitor: the one object that sits in the user's training loop.

    monitor = gpudash.Monitor("runs/exp1")
    monitor.watch(model, optimizer)
    for batch in loader:
        with monitor.step(samples=len(batch)):
            with monitor.phase("forward"):
                loss = model(batch)
            with monitor.phase("backward"):
                loss.backward()
            with monitor.phase("optimizer"):
                opt.step(); opt.zero_grad()
            monitor.log(loss=loss)
    monitor.close()

The training thread only takes timestamps and appends rows to a bounded
buffer; tensors passed to ``log`` are detached here and turned into numbers by
the writer thread, so nothing on this path waits on the GPU or the disk.

Modules: ``core`` (the Monitor and its API), ``timing`` (the step and phase
timers that run every step), ``names`` (what a logged value is stored as),
``memory_rows`` (one memory record per step), ``exits`` (exception, Ctrl-C,
SIGTERM and interpreter-exit handlers).
"""

from __future__ import annotations

from gpudash.monitor.core import Monitor

__all__ = ["Monitor"]
