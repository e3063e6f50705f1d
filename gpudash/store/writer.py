"""Append-only, crash-safe writer of one rank's records.

The training thread only queues: :meth:`Recorder.put` (a deque append; a step row is packed into the
:class:`~gpudash.store.steplog.StepLog`), with a 0.2 ms sleep now and then in a loop that holds the GIL and
queues faster than the writer gets the GIL to store (:mod:`gpudash.store.lending`). A daemon thread drains the
queues every ``flush_interval`` seconds (sooner when ``flush_rows`` records wait) into ``rankN.db`` (SQLite, WAL
mode), one transaction per flush. The time roll-ups and the ``heartbeat`` meta key are stored every
:data:`ROLLUP_INTERVAL_S` seconds (and on :meth:`Recorder.flush` and at close); between them the heartbeat is
the write-ahead log's modification time, which every flush renews, so a reader can tell a live run from a
killed one without a page written for it (:meth:`gpudash.store.reader.RankReader.meta`). When the queue is
full the oldest record is dropped and counted; the count is recorded in the meta table.

Nothing a training loop logs stops the writer: a value SQLite cannot store is
stored another way (an integer beyond 64 bits as a float, a non-UTF-8 string
escaped) or dropped and counted (``dropped_values``); a write that fails
because the disk is full (or the file is locked, or unwritable for a while)
keeps its records in memory and is retried every flush until it succeeds;
any other failure loses only the records that cause it. Each problem is said
once: in :attr:`Recorder.errors`, on stderr, and as an event in the run.

The SQL side lives in :mod:`gpudash.store.tables` (and :mod:`~gpudash.store.columns`),
value conversion in :mod:`gpudash.store.values`, which failures are retried and the one-time
reporting of problems in :mod:`gpudash.store.failures`.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudash.errors import RunError
from gpudash.store.attempts import attempt_meta, last_step, previous, racing
from gpudash.store.failures import Problems, is_transient
from gpudash.store.lending import LEND_ROWS, Lender
from gpudash.store.meta import fit_text_facts
from gpudash.store.publish import SegmentPublisher
from gpudash.store.rankfile import log_heartbeat, wal_path
from gpudash.store.redact import redact_meta
from gpudash.store.schema import RUN_META_FILE, rank_db_name
from gpudash.store.segments import read_meta_rows
from gpudash.store.sharedfs import shared_mode
from gpudash.store.steplog import StepLog, drop_oldest, last_step_of, record_rows, records
from gpudash.store.tables import TABLE_TAG, TableWriter, connect
from gpudash.store.values import to_plain

__all__ = ["OPEN_ERRORS", "Recorder", "to_plain"]

#: What opening a run for writing can raise (a bad folder, a file that is not a database).
OPEN_ERRORS = (OSError, sqlite3.Error)

#: Records per transaction: a backlog (a stall, a burst) is committed piece by piece, so one
#: transaction never grows the write-ahead log past a few MB.
_BATCH = 8192
#: Queued records at which :meth:`Recorder.put` wakes the writer before its interval is up (the training thread
#: only sets an event; it never waits): the queue's size is bounded by this count, not by what a fast loop
#: logs in one interval (a loop of 1 ms steps queued its whole first 0.5 s, growing the watched process's
#: memory for its first ~400 steps), so it reaches its steady size within the first few dozen steps.
FLUSH_ROWS = 64
#: Seconds between stores of the roll-ups and the ``heartbeat`` meta key (see the module doc).
ROLLUP_INTERVAL_S = 10.0
_TABLE = TABLE_TAG
_Record = dict[Any, Any]
#: Failed transactions per flush spent on isolating the records that cannot be written.
_FAIL_BUDGET = 64


class Recorder:
    """Bounded buffer + background writer for one rank of one run."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int = 0,
        flush_interval: float = 0.5,
        capacity: int = 200_000,
        meta: dict[str, Any] | None = None,
        publish_to: str | None = None,
        flush_rows: int = FLUSH_ROWS,
    ) -> None:
        if flush_interval <= 0:
            raise ValueError("flush_interval must be > 0 seconds")
        if capacity < 1:
            raise ValueError("capacity must be >= 1 record")
        if flush_rows < 1:
            raise ValueError("flush_rows must be >= 1 record")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.flush_interval = flush_interval
        self.capacity = capacity
        #: queued records at which put() wakes the writer (see FLUSH_ROWS)
        self.flush_rows = min(flush_rows, capacity)
        self._dropped = 0  # records of other tables dropped, and records the writer could not store
        #: values that could not be stored in any form (their cell is left empty; see errors)
        self.dropped_values = 0
        self._retry: list[_Record] = []  # records of a write that failed for now
        self._stalled = False  # a write failed for now in this flush: keep the rest for the next one
        self._failing: tuple[float, str] | None = None  # (since, message) while writes fail for now
        self._budget = _FAIL_BUDGET
        self._last_step: Any = None
        self._meta_pending: dict[str, Any] = {}
        self._meta_lock = threading.Lock()
        self._buf: deque[_Record] = deque(maxlen=capacity)
        #: the ``steps`` rows, packed on the recording thread (:mod:`gpudash.store.steplog`); a full block of
        #: ``flush_rows`` wakes the writer
        self.steps = StepLog(capacity, block_rows=self.flush_rows, on_block=self._steps_waiting)
        #: called with (table, row) for every record queued but ``steps`` and with ("meta", items) for run-level
        #: facts, on the recording thread, before the row is the writer's: in-process readers (the leak watch's
        #: window) get rows without reading them back; it must be cheap and must not block
        self.tap: Callable[[str, dict[str, Any]], None] | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._woken = False
        #: set after each flush (the queue drained): the leak watch lets go of the rows it holds then
        self.drained = threading.Event()
        self._flushed = threading.Condition()
        self._req_seq = 0  # flush requests made / served (see flush())
        self._done_seq = 0
        self._publish_failed = False  # the last attempt to publish a copy failed
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / rank_db_name(rank)
        #: says each problem once (gpudash.store.failures.Problems): ``errors`` lists them
        self._report = Problems(self.path.name, lambda row: self.put("events", row), lambda: self._last_step,
                                self._count_unreported)
        self.errors = self._report.errors
        # a run folder other hosts share, or an object store (``publish_to``, with ``run_dir`` a local staging
        # folder): the live database on local storage, its new rows published there as segments
        shared = f"object store {publish_to}" if publish_to else shared_mode(self.run_dir)
        self._publisher = None
        if shared:
            self._publisher = SegmentPublisher(publish_to or self.run_dir, rank, self._report_publish,
                                               live_dir=self.run_dir if publish_to else None,
                                               run_json=self.run_dir / RUN_META_FILE if publish_to else None)
        live = self._publisher.live_path if self._publisher else self.path
        #: the database this process writes (local even when the run is published elsewhere): its own readers'
        self.live_path = live
        beat = log_heartbeat(self.path) if self._publisher is None else None  # before we open it
        self._conn = connect(live)
        self._wal = wal_path(live)
        before = self._previous_meta()
        clash = racing(before, beat, f"{publish_to or self.run_dir} rank {rank}")
        if clash is not None:
            self._abandon()
            raise RunError(clash)
        #: the attempt before this one in this rank's records (None: this is the first); see gpudash.store.attempts
        self.previous = previous(before, beat)
        self.attempt = self.previous.attempt + 1 if self.previous else 1
        start = {
            "rank": rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.time(),
            "status": "live",
            "heartbeat": time.time(),
            "flush_interval": flush_interval,
            "dropped_records": 0,  # stored again only when it changes
        }
        if self._publisher is not None:
            start.update(shared_fs=shared, publish_interval=self._publisher.interval,
                         live_db=str(self._publisher.live_path))
        start.update(redact_meta(meta or {}))
        # the run's facts carry over from an attempt before; the process's are this attempt's own
        start, gone = attempt_meta(start, self.previous, before)
        if gone and self._publisher is None:
            self._conn.executemany("DELETE FROM meta WHERE key = ?", [(k,) for k in gone])
        self._tables = TableWriter(self._conn, self._report, meta=start, attempt=self.attempt)
        #: the meta this attempt started with (what later ``put_meta`` calls add to)
        self.start_meta = start
        self._dropped_stored = 0
        self._rollups_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"gpudash-writer-{rank}", daemon=True)
        #: lends the writer the GIL when a loop that holds it queues records faster than the writer stores them
        self.lender = Lender(self._thread, min(LEND_ROWS, capacity), self._stop)
        self._thread.start()

    def _previous_meta(self) -> dict[str, Any]:
        """The rank's meta as the previous attempt left it: in the rank's database, or (published) its
        ``meta.json`` on the store ({} when there is none; a store that cannot say is said once)."""
        if self._publisher is not None:
            return self._publisher.previous_meta()
        try:
            return {**read_meta_rows(self._conn), "last_step": last_step(self._conn)}
        except sqlite3.Error:
            return {}  # a new database: no meta table yet

    def _abandon(self) -> None:
        """Undo the start (a refused attempt): close the database, stop the uploader, write nothing."""
        try:
            self._conn.close()
        except sqlite3.Error:
            pass
        if self._publisher is not None:
            self._publisher.abandon()

    # ---- training-thread API (no I/O) -------------------------------------------------
    @property
    def dropped(self) -> int:
        """Records never stored: the oldest past ``capacity`` (steps and the other tables counted apart), and
        those a write refused."""
        return self._dropped + self.steps.dropped

    @property
    def queued(self) -> int:
        """Records waiting for the writer."""
        return len(self._buf) + self.steps.waiting()

    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue one record (the row is the writer's from now on). Never blocks; drops the
        oldest record when full; wakes the writer when ``flush_rows`` records wait (unless writes
        are failing for now: then they wait for the next retry, the queue bounded by ``capacity``).
        A ``steps`` row goes to :attr:`steps` (packed there: the Monitor hands it over directly)."""
        if table == "steps":
            self.steps.put(row)
            return
        tap = self.tap
        if tap is not None:
            tap(table, row)
        row[_TABLE] = table
        buf = self._buf
        if len(buf) + self.steps.waiting() >= self.flush_rows:  # (step rows wait too: one writer for both)
            self._crowded()
        buf.append(row)

    def _crowded(self) -> None:
        """``flush_rows`` records wait: count the one the next append drops (when full), then :meth:`_waiting`."""
        n = len(self._buf)
        if n >= self.capacity:
            self._dropped += 1
        self._waiting(n + self.steps.waiting())

    def _steps_waiting(self, n: int) -> None:
        """A block of step rows is full: ``n`` step rows wait, and the queue's records."""
        self._waiting(n + len(self._buf))

    def _waiting(self, n: int) -> None:
        """``n`` records wait (``flush_rows`` or more): wake the writer once, and lend it the GIL when
        ``lender.rows`` wait (:class:`gpudash.store.lending.Lender`)."""
        if n < self.flush_rows or self._failing is not None:
            return
        if not self._woken:
            self._woken = True
            self._wake.set()
        elif n >= self.lender.at:
            self.lender.lend(n)

    def put_meta(self, **items: Any) -> None:
        """Queue run-level facts; kept apart from the bounded record buffer so they are never dropped."""
        # nothing that looks like a credential is recorded (gpudash.store.redact); text facts fit what the reader
        # takes (a torch OOM message on a busy GPU runs past 1,000 characters)
        items = fit_text_facts(redact_meta(items))
        tap = self.tap
        if tap is not None:
            tap("meta", items)
        with self._meta_lock:
            self._meta_pending.update(items)

    # ---- control ------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Ask the writer thread to flush now and wait until it has. False when it could not
        (timeout, or writes failing for now: the records wait in memory, see ``errors``)."""
        if not self._thread.is_alive():
            return False
        with self._flushed:
            self._req_seq += 1
            mine = self._req_seq
            self._wake.set()
            done = self._flushed.wait_for(lambda: self._done_seq >= mine, timeout)
        return done and self._failing is None

    def close(self, status: str = "finished", reason: str = "closed", timeout: float = 120.0) -> None:
        """Flush everything, record why the run ended, stop the thread."""
        if self._stop.is_set():
            return
        self.put_meta(status=status, end_reason=reason, ended_at=time.time())
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():  # pragma: no cover - writer stuck on a slow disk
            print(f"gpudash: writer for {self.path} did not finish within {timeout:.0f} s; "
                  f"{self.queued} records not written", file=sys.stderr)
            return
        if self._retry:
            self._dropped += record_rows(self._retry)
            print(f"gpudash: {record_rows(self._retry)} records could not be written to {self.path} before it closed "
                  f"({self._failing[1] if self._failing else 'write failed'})", file=sys.stderr)
            self._retry = []
        pub = self._publisher
        complete = False
        if pub is not None:
            try:
                complete = not self._publish_failed and pub.finish(self._conn, timeout=min(timeout, 60.0))
            except BaseException as exc:  # noqa: BLE001 - the records stay in the live database
                self._report(f"writer: publishing the end of the run failed ({type(exc).__name__}: {exc})",
                             event=False)
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()
        except sqlite3.Error:
            pass
        if pub is not None:
            if complete:
                pub.cleanup()  # the store holds every record
            else:
                print(f"gpudash: {pub.pending()} segment(s) of {self.path.name} could not be published to "
                      f"{pub.dest}; every record is in {pub.live_path}, and the segments waiting in {pub.outbox} "
                      f"(copy that folder's contents into the run: e.g. aws s3 sync or cp -r)", file=sys.stderr)

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    # ---- writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._woken = False  # (set by put when rows crowd: the next crowd wakes the writer again)
            stopping = self._stop.is_set()
            with self._flushed:
                serving = self._req_seq
                asked = serving > self._done_seq  # flush() waits: store the roll-ups too
            publishing = self._publisher is not None and (stopping or self._publisher.due())
            try:
                self._flush_once(final=stopping, everything=stopping or asked or publishing)
            except BaseException as exc:  # noqa: BLE001 - the writer outlives anything a record does
                self._report(f"writer: unexpected {type(exc).__name__}: {exc}")
            self.drained.set()
            self.lender.drained()
            self._touch_wal()
            if publishing:
                self._publish()
            with self._flushed:
                self._done_seq = serving
                self._flushed.notify_all()
            if stopping:
                return

    def _touch_wal(self) -> None:
        """Renew the heartbeat a reader sees: the log's modification time (a commit renewed it already)."""
        try:
            os.utime(self._wal)
        except OSError:
            pass  # no log yet, or none any more (closed): the heartbeat in meta says when the writer was last seen

    def _publish(self) -> None:
        """Shared storage: the rows committed since the last publish, as segments for the uploader."""
        assert self._publisher is not None
        try:
            self._publisher.publish(self._conn)
        except BaseException as exc:  # noqa: BLE001 - retried at the next interval; records stay local
            self._report(f"writer: cannot publish {self.path} ({type(exc).__name__}: {exc}); the live copy "
                         f"{self._publisher.live_path} keeps every record, retrying every "
                         f"{self._publisher.interval:g} s", key=f"publish: {type(exc).__name__}", event=False)
            self._publish_failed = True
            return
        self._publish_failed = False

    def _flush_once(self, *, final: bool = False, everything: bool = False) -> None:
        """Drain the buffer in transactions of at most _BATCH records, so a long backlog is
        committed piece by piece; the last one also stores meta, and the roll-ups and heartbeat
        when they are due (``everything``: now). Records of a write that failed for now go
        first; after such a failure the rest waits. ``final``: the last flush (close)."""
        self._budget = _FAIL_BUDGET
        self._stalled = False
        due = everything or time.monotonic() - self._rollups_at >= ROLLUP_INTERVAL_S
        retry, self._retry = self._retry, []
        pop = self._buf.popleft
        steps = self.steps
        while True:
            items, retry = retry[:_BATCH], retry[_BATCH:]
            got = steps.take(steps.writer, records, _BATCH) if not retry else []
            taken = record_rows(got)
            items += got
            try:
                while len(items) < _BATCH:
                    items.append(pop())
            except IndexError:
                pass
            last = len(items) < _BATCH and not retry and taken < _BATCH
            self.lender.progress += 1
            self._commit(items, rollups=last and due, final=last and final)
            if self._stalled:
                self._retry += retry
                return
            if last:
                return

    def _commit(self, items: list[_Record], *, rollups: bool = False, final: bool = False) -> None:
        """Write ``items`` in one transaction (with the roll-ups and the heartbeat if ``rollups``; with
        the rows that wait for a chunk if ``final``). A failure "for now" (disk full, ...) keeps them
        for the next flush; any other failure is narrowed down to the records that cause it."""
        if self._stalled:
            self._retry += items
            return
        by_table: dict[str, list[_Record]] = {}
        with self._meta_lock:
            meta, self._meta_pending = self._meta_pending, {}
        for row in items:
            by_table.setdefault(row.get(_TABLE, "?"), []).append(row)
        if rollups or final:
            meta["heartbeat"] = time.time()
        dropped = self.dropped
        if dropped != self._dropped_stored:
            meta["dropped_records"] = dropped
        steps = by_table.get("steps")
        if steps:
            self._last_step = last_step_of(steps[-1], self._last_step)
        tables = self._tables
        if not items and not meta and not tables.rollups.pending:
            return  # nothing to write: no transaction (the log's mtime is the heartbeat)
        try:
            tables.begin()
            self._conn.execute("BEGIN")
            for table, rows in by_table.items():
                tables.insert(table, rows)
            if self.dropped_values or tables.txn_dropped_values:
                meta["dropped_values"] = self.dropped_values + tables.txn_dropped_values
            if rollups or final:
                tables.write_rollups()
            if final:
                tables.write_chunks()
            tables.write_meta(meta)
            self._conn.execute("COMMIT")
            self.lender.progress += 1
            self.dropped_values += tables.txn_dropped_values
            self._dropped_stored = int(meta.get("dropped_records", self._dropped_stored))
            if rollups:
                self._rollups_at = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - whatever failed, the transaction is undone
            self._rollback()
            meta.pop("heartbeat", None)
            with self._meta_lock:
                self._meta_pending = {**meta, **self._meta_pending}
            if is_transient(exc):
                self._write_failed(exc, items)
            elif not items:
                self._report(f"writer: {type(exc).__name__}: {exc}")
            elif len(items) == 1 or self._budget <= 0:
                self._dropped += record_rows(items)
                self._report(f"writer: {record_rows(items)} record(s) of {items[0].get(_TABLE)} not written "
                             f"({type(exc).__name__}: {exc})", key=f"writer: {type(exc).__name__}: {exc}")
            else:
                self._budget -= 1
                mid = len(items) // 2
                self._commit(items[:mid])
                self._commit(items[mid:], rollups=rollups, final=final)
            return
        if self._failing is not None:
            self._write_resumed()

    def _rollback(self) -> None:
        """Undo the open transaction, and what the caches learnt in it (added columns, roll-up sums)."""
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite may have rolled back already (e.g. on a full disk)
        self._tables.rollback()

    def _write_failed(self, exc: BaseException, items: list[_Record]) -> None:
        """A write failed for now: keep the records (bounded by ``capacity``) and say so once."""
        self._stalled = True
        self._retry += items
        self._dropped += drop_oldest(self._retry, record_rows(self._retry) + len(self._buf) - self.capacity)
        if self._failing is None:
            self._failing = (time.time(), f"{type(exc).__name__}: {exc}")
            self._report(f"writer: cannot write {self.path} ({exc}); keeping up to {self.capacity} records in "
                         f"memory and retrying every {self.flush_interval:g} s (free space to resume)",
                         key=f"writer: cannot write ({exc})", event=False)

    def _write_resumed(self) -> None:
        assert self._failing is not None
        since, why = self._failing
        self._failing = None
        msg = (f"could not write for {time.time() - since:.1f} s ({why}); writing resumed, "
               f"{self.dropped} records dropped so far")
        print(f"gpudash: {self.path}: {msg}", file=sys.stderr)
        self.put("events", {"time": since, "step": self._last_step, "kind": "write_error", "message": msg,
                            "data": {"error": why, "dropped_records": self.dropped}})

    @property
    def unreported(self) -> int:
        """Problems only counted, past :data:`~gpudash.store.failures.MAX_REPORTS` said."""
        return self._report.unreported

    def _count_unreported(self, n: int) -> None:
        with self._meta_lock:
            self._meta_pending["unreported_problems"] = n

    def _report_publish(self, msg: str, key: str) -> None:
        """The uploader's states (failing, resumed): said once each, and recorded as events in the run."""
        self._report(msg, key=key, kind="publish")
