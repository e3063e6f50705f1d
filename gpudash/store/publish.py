"""Publishing one rank's records to shared storage as append-only segments (:mod:`gpudash.store.segments`).

The rank's live SQLite database stays on node-local storage (SQLite's log is unsafe on NFS, Lustre or
FUSE, and an object store has no files to lock at all). Every ``interval`` seconds the writer thread
calls :meth:`SegmentPublisher.publish`: the rows written since the last call, table by table, become
Parquet files in a local *outbox* that mirrors the destination's layout. A separate uploader thread
puts them on the store in order, then the rank's ``meta.json`` (with a fresh heartbeat), and removes
each from the outbox once the store has it. So what goes to shared storage per publish is what is new,
whatever the run's length; the training thread never waits on it, and the writer thread only reads
rows it just wrote from the page cache.

A store that refuses or does not answer is a state: said once (stderr, ``Recorder.errors``, an event in
the run), retried every few seconds, said again when it ends; the outbox and the live database keep
everything meanwhile (disk, not memory). Every :data:`MERGE_EVERY` segments of a table are merged into
one (the merged file is put before the small ones are removed: readers always find a complete chain),
and at the end of the run each table becomes one file, when the store is reachable.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudash.store.attempts import last_step
from gpudash.store.listing import LISTING_KEY, ListingTally, embedded_run_json
from gpudash.store.localdisk import staging_dir
from gpudash.store.objstore import Store, open_store
from gpudash.store.schema import RUN_META_FILE, rank_db_name
from gpudash.store.segments import (
    PUBLISHED_TABLES,
    SEGMENTS_DIR,
    export_rows,
    parse_segment,
    rank_meta_name,
    read_meta_rows,
    segment_name,
    segment_ranks,
    shift_rowids,
)

__all__ = ["MERGE_EVERY", "PUBLISH_INTERVAL_S", "RETRY_S", "SegmentPublisher"]

#: Seconds between publishes: the live latency a reader on another node sees.
PUBLISH_INTERVAL_S = 3.0
#: Small segments of one table merged into one (keeps a long run's listing short; see the module doc).
MERGE_EVERY = 64
#: Seconds between attempts while the store refuses.
RETRY_S = 2.0
#: Seconds the end of a run waits for a store that is refusing at that moment (the records stay local).
FAILING_GRACE_S = 5.0
#: ``report(message, key)``: say a problem once (the writer's reporter).
Report = Callable[[str, str], None]


class SegmentPublisher:
    """Exports one rank's new rows into an outbox and uploads them from a thread of its own."""

    def __init__(self, dest: str | os.PathLike[str], rank: int, report: Report, *, live_dir: Path | None = None,
                 interval: float | None = None, run_json: Path | None = None) -> None:
        self.store: Store = open_store(dest)
        self.dest = str(dest)
        self.rank = rank
        self.interval = PUBLISH_INTERVAL_S if interval is None else interval
        self._report = report
        if live_dir is None:
            live_dir = staging_dir(f"rank{rank}")
        self.live_dir = live_dir
        self.live_path = live_dir / rank_db_name(rank)
        self.outbox = live_dir / "outbox"
        self.outbox.mkdir(parents=True, exist_ok=True)
        self._run_json = run_json
        #: the run.json this publisher put, as its meta.json carries it (:func:`embedded_run_json`)
        self._run_json_copy: dict[str, Any] | None = None
        self.published_at = 0.0
        #: bytes put on the store so far (segments and meta), and of them the segments'
        self.bytes_put = 0
        self.segment_bytes = 0
        #: (since, why) while the store refuses or does not answer
        self.failing: tuple[float, str] | None = None
        self._last: dict[str, int] = {}  # table -> last rowid exported
        self._names: dict[str, list[str]] = {}  # table -> segments on the store (or on their way), in order
        self._small: dict[str, int] = {}  # table -> segments exported since its last merge
        self._queue: deque[tuple[str, str]] = deque()  # ("put" | "rm", name), done in order
        #: table -> the last rowid an earlier attempt of this rank published (read from the store before the
        #: first upload): this attempt's segments and rowids continue after it, never over it
        self._bases: dict[str, int] | None = None
        self._meta: dict[str, Any] | None = None
        self._tally = ListingTally()
        self._meta_seq = self._meta_done = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._upload_loop, name=f"gpudash-upload-{rank}", daemon=True)
        self._thread.start()

    # ---- writer thread ----------------------------------------------------------------------------
    def previous_meta(self) -> dict[str, Any]:
        """The rank's meta as an earlier attempt left it on the store (its ``meta.json``; {} when there is none,
        or when the store cannot say: said once on stderr, and nothing published is overwritten, as the
        uploader numbers its rows after what is there)."""
        try:
            doc = json.loads(self.store.get(rank_meta_name(self.rank), limit=1 << 22))
        except FileNotFoundError:
            return {}
        except Exception as exc:  # noqa: BLE001
            print(f"gpudash: {self.dest}: cannot read rank {self.rank}'s earlier attempt ({type(exc).__name__}: "
                  f"{str(exc)[:200]}); recording as its first attempt, nothing published is overwritten",
                  file=sys.stderr)
            return {}
        return doc if isinstance(doc, dict) else {}

    def due(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) - self.published_at >= self.interval

    def publish(self, conn: sqlite3.Connection) -> None:
        """Put the rows committed since the last call into the outbox, one segment per table that has new
        rows, and the rank's meta; the uploader takes them from there."""
        for table in PUBLISHED_TABLES:
            after = self._last.get(table, 0)
            while True:
                data, last = export_rows(conn, table, after)
                if data is None:
                    break
                self._enqueue(table, segment_name(self.rank, table, after, last), data)
                self._small[table] = self._small.get(table, 0) + 1
                self._last[table] = after = last
            if self._small.get(table, 0) >= MERGE_EVERY:
                self._merge(conn, table, self._names[table][-self._small[table]:])
        meta = {**read_meta_rows(conn), "last_step": last_step(conn),  # where a next attempt goes on
                LISTING_KEY: self._tally.update(conn)}  # what a runs list shows, without reading a segment
        with self._lock:
            self._meta = meta
            self._meta_seq += 1
        self.published_at = time.time()
        self._wake.set()

    def _enqueue(self, table: str, name: str, data: bytes) -> None:
        path = self.outbox / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        with self._lock:
            self._queue.append(("put", name))
        self._names.setdefault(table, []).append(name)

    def _merge(self, conn: sqlite3.Connection, table: str, names: list[str]) -> None:
        """Replace ``names`` (consecutive segments of ``table``) by as few as their rows make: put first,
        then remove, so readers always find a chain (:func:`gpudash.store.segments.chain`)."""
        spans = [parse_segment(n) for n in names]
        if len(names) < 2 or any(s is None for s in spans):
            return
        after, upto = spans[0][0], spans[-1][1]  # type: ignore[index]
        made: list[tuple[str, bytes]] = []
        while after < upto:
            data, last = export_rows(conn, table, after, upto)
            if data is None:
                break
            made.append((segment_name(self.rank, table, after, last), data))
            after = last
        if after < upto:
            return  # rows gone from the local database (cannot happen while it is ours): keep the small ones
        kept = [n for n in self._names[table] if n not in names]
        with self._lock:
            for name, data in made:
                path = self.outbox / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                self._queue.append(("put", name))
            self._queue.extend(("rm", n) for n in names)
        pos = self._names[table].index(names[0])
        self._names[table] = kept[:pos] + [n for n, _ in made] + kept[pos:]
        self._small[table] = 0

    def finish(self, conn: sqlite3.Connection, timeout: float) -> bool:
        """At the end of the run (after the last :meth:`publish`): merge each table into one file when the
        store is reachable, upload what waits, stop the thread. True when the store holds every record."""
        if self.failing is None:
            for table in PUBLISHED_TABLES:
                names = self._names.get(table, [])
                if len(names) > 1:
                    try:
                        self._merge(conn, table, list(names))
                    except (sqlite3.Error, OSError) as exc:
                        self._report(f"publish: cannot merge the segments of {table} ({exc}); they stay as they are",
                                     f"merge {table}")
        if self.failing is not None:
            timeout = min(timeout, FAILING_GRACE_S)
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout + 1.0)
        with self._lock:
            return not self._queue and self._meta_done == self._meta_seq and self.failing is None

    def uploaded(self, timeout: float) -> bool:
        """Wait until everything exported so far is on the store (tests and benchmarks wait on it)."""
        end = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._queue and self._meta_done == self._meta_seq:
                    return True
            if time.monotonic() >= end:
                return False
            self._wake.set()
            time.sleep(0.02)

    def pending(self) -> int:
        """Uploads and removals still waiting."""
        with self._lock:
            return len(self._queue)

    def abandon(self) -> None:
        """Stop without uploading anything (a start that was refused) and remove the local copy."""
        with self._lock:
            self._queue.clear()
            self._meta = None
        self._run_json = None
        self._bases = {}
        self._deadline = 0.0
        self._stop.set()
        self._wake.set()
        self._thread.join(5.0)
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the local copy (call once :meth:`finish` said the store holds everything)."""
        shutil.rmtree(self.live_dir, ignore_errors=True)

    # ---- uploader thread ---------------------------------------------------------------------------
    def _upload_loop(self) -> None:
        while True:
            stopping = self._stop.is_set()
            self._wake.wait(0.2 if stopping else (RETRY_S if self.failing else 1.0))
            self._wake.clear()
            ok = self._drain()
            # only a drain that began after finish() asked to stop has seen everything it queued
            if stopping and (ok or time.monotonic() >= self._deadline):
                return

    def _drain(self) -> bool:
        """Do what waits, in order; False at the first failure (retried later)."""
        try:
            if self._run_json is not None and not self.store.exists(RUN_META_FILE):
                data = self._run_json.read_bytes()
                self._put(RUN_META_FILE, data)
                # its copy rides in the rank's meta.json: a runs list reads one object per run, not two
                self._run_json_copy = embedded_run_json(data)
            self._run_json = None
            if self._bases is None:
                self._bases = self._earlier_attempts()
            while True:
                with self._lock:
                    item = self._queue[0] if self._queue else None
                if item is None:
                    break
                op, name = item
                if op == "put":
                    data = (self.outbox / name).read_bytes()
                    stored, shifted = self._after_earlier(name, data)
                    data = data if shifted is None else shifted
                    self._put(stored, data)
                    self.segment_bytes += len(data)
                    (self.outbox / name).unlink(missing_ok=True)
                else:
                    self.store.remove(self._after_earlier(name, None)[0])
                with self._lock:
                    self._queue.popleft()
            with self._lock:
                meta, seq = self._meta, self._meta_seq
            if meta is not None and seq != self._meta_done:
                now = time.time()
                doc = {**meta, "heartbeat": now, "publish_interval": self.interval, "published_at": now,
                       "segments": True}
                if self._run_json_copy is not None and isinstance(doc.get(LISTING_KEY), dict):
                    doc[LISTING_KEY] = {**doc[LISTING_KEY], **self._run_json_copy}
                self._put(rank_meta_name(self.rank), json.dumps(doc, default=str).encode())
                self._meta_done = seq
        except Exception as exc:  # noqa: BLE001 - any failure of the store is a state, retried
            self._failed(exc)
            return False
        return True

    def _earlier_attempts(self) -> dict[str, int]:
        """The last rowid of each table this rank published before this process began (its earlier attempts)."""
        tables = segment_ranks(self.store.find(f"{SEGMENTS_DIR}/rank={self.rank}")).get(self.rank, {})
        return {t: max(last for _, last, _ in spans) for t, spans in tables.items() if spans}

    def _after_earlier(self, name: str, data: bytes | None) -> tuple[str, bytes | None]:
        """A segment's name (and bytes) as stored: its rows numbered after the earlier attempts' rows."""
        parts = name.split("/")
        base = (self._bases or {}).get(parts[-2], 0) if len(parts) >= 2 else 0
        span = parse_segment(name)
        if not base or span is None:
            return name, data
        stored = segment_name(self.rank, parts[-2], span[0] + base, span[1] + base)
        return stored, (None if data is None else shift_rowids(data, base))

    def _put(self, name: str, data: bytes) -> None:
        self.store.put(name, data)
        self.bytes_put += len(data)
        if self.failing is not None:  # the first upload that succeeds: said before the queue empties (a caller
            since, why = self.failing  # waiting on uploaded() then finds it said, and recorded in the run)
            self.failing = None
            self._report(f"publish: uploads to {self.dest} resumed after {time.time() - since:.0f} s ({why}); "
                         "nothing was lost", f"publish resumed {since}")

    def _failed(self, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        if self.failing is None:
            self.failing = (time.time(), why)
            self._report(f"publish: cannot upload to {self.dest} ({why}); recording continues locally in "
                         f"{self.live_dir}, retrying every {RETRY_S:g} s", f"publish failing {self.failing[0]}")
