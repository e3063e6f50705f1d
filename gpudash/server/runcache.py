"""One place where a server process opens runs: the loaded run, its facts and verdicts, per run.

The dashboard pages, ``/api/...``, the runs list and ``/metrics`` all ask
:func:`shared_cache` for a run; it is loaded with :func:`gpudash.load_run` and
its facts derived once per change of the run's files (a live run at most
every ``live_every_s``, so its lights keep moving without a reload per tick).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudash.analysis.facts import Facts, run_facts
from gpudash.analysis.verdict import Verdict
from gpudash.errors import RunError
from gpudash.store.listed import listed_run
from gpudash.store.reader import RunReader
from gpudash.store.run import Run, load_run
from gpudash.store.segments import SEGMENTS_DIR

__all__ = ["Loaded", "RunBusy", "RunCache", "WAIT_S", "run_stamp", "shared_cache"]

#: How long a server request waits for a run another request is reading (a slow, damaged run holds up
#: only requests for itself, and those only this long).
WAIT_S = 20.0


def run_stamp(path: Path) -> tuple[Any, ...]:
    """Changes whenever any file of the run changes (a run listed from an object store: whenever its
    metadata objects do, :class:`gpudash.store.listed.ListedRun`)."""
    listed = listed_run(path)
    if listed is not None:
        return ("listed", *listed.stamp)
    out = []
    try:
        entries = sorted(Path(path).iterdir())
    except OSError:
        return ()
    # a run published as segments (gpudash.store.segments): each rank's meta.json is rewritten at every publish
    # (looked for only where a segments folder is: a folder of a thousand local runs is stat'ed, not globbed)
    if any(p.name == SEGMENTS_DIR for p in entries):
        entries += sorted(Path(path).glob(f"{SEGMENTS_DIR}/rank=*/meta.json"))
    for p in entries:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((p.name if p.parent == Path(path) else str(p.relative_to(path)), st.st_mtime_ns, st.st_size))
    return tuple(out)


@dataclass
class Loaded:
    """A loaded run and what analysis says about it (verdicts computed on first use)."""

    run: Run
    facts: Facts
    stamp: tuple[Any, ...]
    loaded_at: float
    _verdicts: list[Verdict] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def verdicts(self) -> list[Verdict]:
        from gpudash.analysis.summary import summarize

        with self._lock:
            if self._verdicts is None:
                self._verdicts = summarize(self.run)
            return self._verdicts


class RunCache:
    """Runs by path (bounded, least recently used dropped): the loaded run with its facts, and an
    open reader for the pages' downsampled views and live tails."""

    def __init__(self, size: int = 16, live_every_s: float = 2.0, readers: int = 32) -> None:
        self.size = size
        self.live_every_s = live_every_s
        self.readers_size = readers
        self._items: OrderedDict[Path, Loaded] = OrderedDict()
        self._locks: dict[Path, threading.Lock] = {}
        self._open_locks: dict[Path, threading.Lock] = {}
        self._readers: OrderedDict[Path, tuple[RunReader, threading.Lock]] = OrderedDict()
        self._lock = threading.Lock()

    def reader(self, path: str | Path) -> tuple[RunReader, threading.Lock]:
        """An open reader of the run at ``path`` and its lock (hold it while reading: SQLite
        connections are not shared mid-query). Raises :class:`gpudash.RunError` when it is not a run."""
        key = Path(path).resolve()
        with self._lock:
            item = self._readers.get(key)
            if item is not None:
                self._readers.move_to_end(key)
                return item
            lock = self._open_locks.setdefault(key, threading.Lock())
        # opened under the run's own lock, never the cache's: a run that is slow to open (a huge or
        # damaged file) holds up only its own requests, every other run is still served
        with lock:
            with self._lock:
                item = self._readers.get(key)
            if item is not None:
                return item
            item = (RunReader(key), threading.Lock())
        with self._lock:
            self._readers[key] = item
            evicted = []
            while len(self._readers) > self.readers_size:
                evicted.append(self._readers.popitem(last=False)[1])
        for old, old_lock in evicted:
            if old_lock.acquire(blocking=False):
                try:
                    old.close()
                finally:
                    old_lock.release()
            else:
                threading.Thread(target=_close_when_free, args=(old, old_lock), daemon=True).start()
        return item

    def current(self, path: str | Path) -> Loaded | None:
        """The run at ``path`` as cached, if no file of it changed since it was read; never loads it."""
        key = Path(path).resolve()
        with self._lock:
            hit = self._items.get(key)
        return hit if hit is not None and hit.stamp == run_stamp(key) else None

    def get(self, path: str | Path, timeout: float | None = None) -> Loaded:
        """The run at ``path`` (raises :class:`gpudash.RunError` when it is not a run, or when another
        request is still loading it after ``timeout`` seconds)."""
        key = Path(path).resolve()
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        if not lock.acquire(timeout=-1 if timeout is None else timeout):
            raise RunBusy(f"{key.name}: still being read by another request after {timeout:g} s; try again")
        try:
            stamp = run_stamp(key)
            hit = self._items.get(key)
            if hit is not None and (hit.stamp == stamp or (
                    hit.run.status == "live" and time.monotonic() - hit.loaded_at < self.live_every_s)):
                with self._lock:
                    self._items.move_to_end(key)
                return hit
            run = load_run(key)
            item = Loaded(run=run, facts=run_facts(run), stamp=stamp, loaded_at=time.monotonic())
            with self._lock:  # a replaced run is not closed: another thread may still read it (GC closes it)
                self._items.pop(key, None)
                self._items[key] = item
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            return item
        finally:
            lock.release()

    def clear(self) -> None:
        with self._lock:
            items, self._items = list(self._items.values()), OrderedDict()
            readers, self._readers = list(self._readers.values()), OrderedDict()
        for it in items:
            it.run.close()
        for reader, lock in readers:
            with lock:
                reader.close()


def _close_when_free(reader: RunReader, lock: threading.Lock) -> None:
    """Close an evicted reader once no request reads it (in a thread: a slow reader holds up nothing)."""
    with lock:
        reader.close()


class RunBusy(RunError):
    """Another request is still reading the run: try again (not damage, so never cached as an answer)."""


_SHARED = RunCache()


def shared_cache() -> RunCache:
    """The process-wide cache every server surface reads runs through."""
    return _SHARED
