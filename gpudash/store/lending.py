"""Lending the writer the GIL: what keeps the record queue short in a loop that holds the GIL.

The writer (:class:`gpudash.store.writer.Recorder`) lets go of the GIL at each SQLite call. A loop that holds
the GIL (pure Python, numpy on small arrays; torch lets it go in its ops) gives it back only at the interpreter's
switch interval (5 ms), so such a writer stores a record or a statement per 5 ms while the loop queues thousands:
before this, a loop of ~7 µs steps grew the queue to its capacity (200,000 records, ~220 MB of the watched
process) and dropped the oldest, and a loop of 50 µs steps held 35,000-91,000 records and kept growing
(``benchmarks/gil_bound.py``, RESULTS.md). The writer also stores big batches in statements of many rows
(:func:`gpudash.store.tables.insert_rows`); what is left is lending: when records come faster than
:data:`LEND_RATE` and :data:`LEND_ROWS` wait, the thread that queues them sleeps :data:`LEND_S` and the writer
runs. That thread never waits on the disk: a lend in which the writer did not run (and was not waiting for a
CPU) is not repeated before another ``LEND_ROWS`` records have queued.
"""

from __future__ import annotations

import threading
import time

__all__ = ["LEND_RATE", "LEND_ROWS", "LEND_S", "Lender"]

LEND_ROWS = 1024
"""Queued records at which a loop that holds the GIL lends it to the writer."""
LEND_S = 0.0002
"""Seconds of one lend: the queuing thread sleeps and the writer runs without waiting for the GIL at each call."""
LEND_RATE = 10_000
"""Records a second (queued since the writer last drained the queue) below which nothing is lent: with steps of
100 µs and more a writer this far behind waits on something else (a slow disk), not on the GIL."""


class Lender:
    """When to lend ``writer`` (the writer's thread) the GIL: at ``at`` queued records (``rows``, or more after a
    lend it did not need). ``stopped``: set when the writer stops (nothing is lent after)."""

    def __init__(self, writer: threading.Thread, rows: int, stopped: threading.Event) -> None:
        self.rows = rows
        self.at = rows
        #: the writer's steps through a flush (rows taken, commits): where its thread has no CPU clock, what says
        #: that it ran in a lend
        self.progress = 0
        self._drained_at = time.monotonic()
        self._writer = writer
        self._stopped = stopped
        self._clock: int | None = None
        self._clock_known = False

    def drained(self) -> None:
        """The writer has drained the queue (its thread, after each flush): the mark goes back to ``rows``."""
        self._drained_at = time.monotonic()
        self.at = self.rows

    def lend(self, n: int) -> None:
        """``n`` records wait (``n >= at``) and the writer was woken: when they came fast, the thread that queues
        them holds the GIL, so it sleeps for ``LEND_S`` and the writer runs. While the writer runs in the time
        lent (its thread's CPU clock moves, or it waits for a CPU) this is done again at the next record; after a
        lend in which it did not run (it waits on the disk: the GIL was not what it lacked), or when the records
        came slowly, not before another ``rows`` have queued. What a lend costs the loop is the writer's own time
        a record, which a loop that holds the GIL pays anyway once the writer gets it; the queue, and the memory
        it holds, stay near ``rows``. Never raises."""
        self.at = n + self.rows  # (unless the writer runs in the time lent, below)
        if (n < LEND_RATE * (time.monotonic() - self._drained_at) or self._stopped.is_set()
                or threading.get_ident() == self._writer.ident):
            return
        clock = self._writer_clock()
        try:
            before = time.clock_gettime(clock) if clock is not None else self.progress
            time.sleep(LEND_S)
            if clock is not None:
                ran = time.clock_gettime(clock) - before >= LEND_S / 4 or self._runnable()
            else:
                ran = self.progress != before
        except OSError:  # (the writer's thread has ended: its clock is gone)
            self._clock = None
            return
        if ran:
            self.at = self.rows

    def _writer_clock(self) -> int | None:
        """The writer thread's CPU clock (Linux), found at the first lend; None where there is none."""
        if not self._clock_known:
            self._clock_known = True
            try:
                self._clock = time.pthread_getcpuclockid(self._writer.ident or 0)
                time.clock_gettime(self._clock)
            except (AttributeError, OSError, OverflowError):
                self._clock = None
        return self._clock

    def _runnable(self) -> bool:
        """The writer's thread waits for a CPU, not for the disk or an event (Linux: its state in /proc is R): on
        a loaded machine a lend in which it did not run is still one it needs."""
        try:
            with open(f"/proc/self/task/{self._writer.native_id}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        return stat[stat.rfind(b")") + 2:][:1] == b"R"
