"""The leak watch's window: the newest rows this rank records (memory, host, steps), handed over in-process.

The recorder hands every row it queues to :meth:`LeakWindow.tap` (on the thread that records it: the training
thread for memory, the host sampler's for host samples), which stores a reference in a fixed ring (one store: no
copy, no lock; the writer holds the same row until its next flush anyway). Every tick (0.1 s) the watch's thread
copies the few numbers the leak rule reads (:data:`gpudash.analysis.leak_rule.RULE_COLUMNS`, and the
capacity's) into fixed arrays made with the window and lets go of the rows, so the window keeps nothing else
and what it holds never grows after it is made. Step rows are not handed over: the window reads them from the
recorder's step log as they were packed (:meth:`LeakWindow.follow`, :mod:`gpudash.store.steplog`), on the same
tick. Nothing is read back from the run's file and nothing waits for
the writer. The watch reads the arrays (:meth:`LeakWindow.columns`), oldest row first.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from gpudash.analysis.capacity import MEMORY_COLUMNS
from gpudash.analysis.leak_rule import RULE_COLUMNS
from gpudash.store.steplog import Cursor, StepLog, numbers

__all__ = ["KEEP_ROWS", "SNAPSHOT_REASON", "LeakWindow", "Ring"]

KEEP_ROWS = 4096
"""Rows of each table (memory, host, steps) the window keeps (the newest)."""
_NAN = float("nan")
_NUMBERS = frozenset({int, float, np.int64, np.int32, np.float64, np.float32})
"""The values a ring stores (anything else, a tensor above all, is stored as NaN: never read, never synced)."""


class Ring:
    """The newest ``size`` rows of one table: the rows handed over since the last look (references, on the
    recording thread), and each kept column's numbers (a fixed array of floats, filled on the watch's thread)."""

    __slots__ = ("first", "n", "pairs", "rows", "size", "taken")

    def __init__(self, names: tuple[str, ...], size: int) -> None:
        self.size = size
        self.n = 0
        """Rows put so far (the newest ``size`` are kept)."""
        self.taken = 0
        """Rows copied into the columns so far."""
        self.first: Any = None
        """The first row's ``step`` as it was recorded (the run's first step: the warm-up counts from it)."""
        self.rows: list[dict[str, Any] | None] = [None] * size
        self.pairs = tuple((name, array("d", [_NAN]) * size) for name in names)

    def take(self) -> int:
        """Copy the rows put since the last call into the columns and let go of them (the watch's thread);
        the rows kept now."""
        n, size, rows = self.n, self.size, self.rows
        start = max(self.taken, n - size)
        for k in range(start, n):
            i = k % size
            row = rows[i]
            rows[i] = None
            if row is None:  # overwritten and taken meanwhile (more than ``size`` rows between two looks)
                continue
            get = row.get
            v: Any
            for name, col in self.pairs:
                v = get(name)
                if v.__class__ not in _NUMBERS:
                    v = _NAN
                col[i] = v
        self.taken = n
        return min(n, size)

    def extend(self, count: int, cols: dict[str, np.ndarray]) -> None:
        """``count`` rows read elsewhere as columns (the step log's), on the watch's thread: the newest ``size``
        are kept. A ring fed this way is fed no rows by :meth:`LeakWindow.tap`."""
        if count <= 0:
            return
        if self.n == 0:
            step = cols.get("step")
            first = float(step[0]) if step is not None and len(step) and np.isfinite(step[0]) else None
            self.first = int(first) if first is not None and first.is_integer() else first
        keep = min(count, self.size)
        at = (np.arange(self.n + count - keep, self.n + count)) % self.size
        for name, col in self.pairs:
            values = cols.get(name)
            np.frombuffer(col, dtype=float)[at] = values[count - keep:] if values is not None else _NAN
        self.n += count
        self.taken = self.n

    def columns(self) -> dict[str, np.ndarray]:
        """Each column's rows taken so far, oldest first (copies: the watch judges them while rows come)."""
        n, size = self.take(), self.size
        cut = self.taken % size
        out = {}
        for name, col in self.pairs:
            a = np.frombuffer(col, dtype=float)
            out[name] = a[:n].copy() if self.taken <= size else np.concatenate((a[cut:], a[:cut]))
        return out


#: The reason the leak watch's own snapshots are stored with (a user's request from the dashboard is "requested");
#: the window keeps those rows for the watch's diff
SNAPSHOT_REASON = "leak watch"


class LeakWindow:
    """What the leak watch judges: rings for memory, host and steps, and the run's meta as it was set."""

    def __init__(self, meta: dict[str, Any] | None = None, size: int = KEEP_ROWS) -> None:
        # the memory rows' device total too: the capacity a GPU leak's "runs out at" is judged against
        self.rings = {t: Ring((*names, *MEMORY_COLUMNS) if t == "memory" else names, size)
                      for t, names in RULE_COLUMNS.items()}
        self.meta: dict[str, Any] = dict(meta or {})
        self.snapshots: list[dict[str, Any]] = []
        """The leak watch's own snapshot rows as they were recorded (reason "leak watch": a run asks for at most
        a few), so its diff needs no flush and no read of the run's file; compressed summaries, held by reference."""
        self.error: str | None = None
        """What stopped the window (a row it could not take: it takes none after it), None while it works."""
        self._log: StepLog | None = None
        self._cursor: Cursor | None = None

    def follow(self, log: StepLog) -> None:
        """Read the steps ring's rows from ``log`` (a best-effort reader: rows it let go before a look are
        missed, never waited for)."""
        self._log, self._cursor = log, log.cursor()

    def unfollow(self) -> None:
        log, cursor = self._log, self._cursor
        self._log = self._cursor = None
        if log is not None and cursor is not None:
            log.release(cursor)

    def tap(self, table: str, row: dict[str, Any]) -> None:
        """One row as it is recorded (``table`` "meta": run-level facts set). Never raises."""
        try:
            ring = self.rings.get(table)
            if ring is not None:
                n = ring.n
                ring.rows[n % ring.size] = row
                ring.n = n + 1
                if n == 0:
                    ring.first = row.get("step")
            elif table == "meta":
                self.meta.update(row)
            elif table == "snapshots" and SNAPSHOT_REASON in str(row.get("reason") or ""):
                if len(self.snapshots) < 8:  # (the watch asks for at most MAX_SNAPSHOTS)
                    self.snapshots.append(row)
        except Exception as exc:  # noqa: BLE001 - the watch says it stopped; the run goes on
            self.error = f"{type(exc).__name__}: {exc}"

    @property
    def rows(self) -> int:
        """Rows tapped so far, all tables."""
        return sum(r.n for r in self.rings.values())

    @property
    def first_step(self) -> float | None:
        """The run's first step (None before the first step's row, or when it was no number)."""
        step = self.rings["steps"].first
        return float(step) if isinstance(step, (int, float, np.number)) and not isinstance(step, bool) else None

    def take(self) -> None:
        """Copy the numbers of the rows handed over since the last call and let go of the rows (the watch's
        thread, every tick: the rows held stay a tick's worth however long a look waits)."""
        log, cursor = self._log, self._cursor
        if log is not None and cursor is not None:
            ring = self.rings["steps"]
            names = tuple(name for name, _ in ring.pairs)
            ring.extend(*log.take(cursor, lambda spans: numbers(spans, names)))
        for ring in self.rings.values():
            ring.take()

    def columns(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Memory, host and steps, as the rule reads them."""
        return self.rings["memory"].columns(), self.rings["host"].columns(), self.rings["steps"].columns()
