"""The reading side of published segments: each rank's segments, followed into a private SQLite cache.

:class:`SegmentMirror` lists a run's ``segments/`` (one listing request on an object store, at most once
per :data:`SYNC_S`), fetches the segments each rank's cache does not hold yet, in rowid order
(:func:`gpudash.store.segments.chain`), and the rank's ``meta.json``. The caches are ordinary rank
databases in a private folder, read by :class:`~gpudash.store.rankreader.RankReader` as any other, so a
published run (on a shared filesystem or in S3) answers every query as a local one does. A store that
fails is noted once and the caches keep what they hold.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudash.store.bounded import UnsafeFile
from gpudash.store.localdisk import META_BYTES, cache_base
from gpudash.store.objstore import Store, open_store
from gpudash.store.schema import rank_db_name
from gpudash.store.segments import SEGMENTS_DIR, SegmentCache, rank_meta_name, segment_ranks

__all__ = ["IN_USE_S", "OPEN_RUNS", "SYNC_S", "SegmentMirror", "cache_bytes", "close_mirrors", "make_room", "forget_origin", "open_mirrors", "origin_of", "segment_mirror",
           "set_origin", "unpublished_note"]

#: Seconds between two listings of the store (a dashboard tick asks more often).
SYNC_S = 1.0


#: Opened runs of an object store whose fetched segments are kept on local disk (least recently used dropped).
OPEN_RUNS = 16
#: Seconds since its last read during which an opened run counts as open now (a page polls every few seconds):
#: the byte bound (:func:`gpudash.store.localdisk.cache_limit`) never evicts it.
IN_USE_S = 30.0
#: local run folder (resolved) -> the run's URL in the store; filled only by :class:`gpudash.store.runsync.RunsMirror` in this
#: process (never from a file: a runs folder cannot point a reader at another store)
_ORIGINS: dict[Path, str] = {}
_MIRRORS: OrderedDict[str, SegmentMirror] = OrderedDict()
_MIRRORS_LOCK = threading.Lock()


def origin_of(path: Path) -> str | None:
    """The object-store URL of a run whose metadata :class:`gpudash.store.runsync.RunsMirror` listed into ``path``; None for any
    other folder."""
    try:
        return _ORIGINS.get(Path(path).resolve())
    except OSError:
        return None


def segment_mirror(url: str, note: Callable[[str], None]) -> SegmentMirror:
    """The one segment cache of the run at ``url`` in this process (shared by every reader of it, so a
    reopened or live run fetches only segments it does not hold yet); at most :data:`OPEN_RUNS` are kept,
    the least recently opened that is not open now (:data:`IN_USE_S`) closed and its files removed; in bytes,
    :func:`make_room` bounds them."""
    with _MIRRORS_LOCK:
        made = _MIRRORS.get(url)
        if made is not None:
            _MIRRORS.move_to_end(url)
            made.notes.append(note)
            if made.full_note:  # a reader that joins a full cache is told too
                note(made.full_note)
        else:
            made = _MIRRORS[url] = SegmentMirror(open_store(url), note)
            made.bounded = True
        evicted = []
        now = time.monotonic()
        while len(_MIRRORS) > max(1, OPEN_RUNS):
            # the least recently opened run that is not open now; when every one is, the least recently opened
            idle = [u for u, m in _MIRRORS.items() if m is not made and now - m.used_at >= IN_USE_S]
            evicted.append(_MIRRORS.pop(idle[0] if idle else next(iter(_MIRRORS))))
    for old in evicted:  # readers still holding its files read them (unlinked, still open); new ones fetch again
        old.close()
    return made


def cache_bytes() -> int:
    """Bytes the opened runs' fetched segments hold on local disk now."""
    return sum(m.disk_bytes() for m in open_mirrors())


def make_room(keep: SegmentMirror, limit: int) -> int:
    """Drop the least recently read opened runs' segments until all fit in ``limit`` bytes, never ``keep``
    nor a run open now (read within :data:`IN_USE_S`, or fetching); returns the bytes still held."""
    with _MIRRORS_LOCK:
        held = sorted(_MIRRORS.items(), key=lambda kv: kv[1].used_at)
    sizes = {url: m.disk_bytes() for url, m in held}
    total = sum(sizes.values())
    now = time.monotonic()
    for url, m in held:
        if total <= limit:
            break
        if m is keep or now - m.used_at < IN_USE_S or not m._sync_lock.acquire(blocking=False):
            continue
        try:
            with _MIRRORS_LOCK:
                if _MIRRORS.get(url) is m:
                    del _MIRRORS[url]
            m._close_locked()  # its readers fetch it again when they are read next
        finally:
            m._sync_lock.release()
        total -= sizes[url]
    return total


def close_mirrors() -> None:
    """Drop every opened run's segment cache (its files removed)."""
    with _MIRRORS_LOCK:
        held = list(_MIRRORS.values())
        _MIRRORS.clear()
    for m in held:
        m.close()


def set_origin(path: Path, url: str) -> None:
    """Say that the run listed into ``path`` is at ``url`` (:class:`gpudash.store.runsync.RunsMirror` only)."""
    _ORIGINS[Path(path).resolve()] = url


def forget_origin(path: Path) -> None:
    _ORIGINS.pop(Path(path).resolve(), None)


def open_mirrors() -> list[SegmentMirror]:
    """The segment caches held now, least recently used first."""
    with _MIRRORS_LOCK:
        return list(_MIRRORS.values())


class SegmentMirror:
    """Private caches of the ranks a run published as segments."""

    def __init__(self, store: Store, note: Callable[[str], None], folder: Path | None = None) -> None:
        self.store = store
        #: where problems are said: the readers of this run (a shared cache: :func:`gpudash.store.runsync.segment_mirror`)
        self.notes: list[Callable[[str], None]] = [note]
        self._sync_lock = threading.Lock()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if folder is None:
            for attempt in range(3):  # the cache's folder removed by the last run closing meanwhile: made again
                try:
                    self._tmp = tempfile.TemporaryDirectory(prefix="gpudash-segments-", dir=cache_base())
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            assert self._tmp is not None
            folder = Path(self._tmp.name)
        self.folder = folder
        self.caches: dict[int, SegmentCache] = {}
        self._synced_at = -1e18
        self._failed = False
        #: monotonic time of the last read (:data:`IN_USE_S`)
        self.used_at = time.monotonic()
        #: one of the opened runs' shared caches, bounded in bytes with them (:func:`make_room`)
        self.bounded = False
        self.closed = False
        self._full_said = False
        #: what the last :meth:`_fits` that found no room said (told to readers that join later)
        self.full_note: str | None = None

    def _note(self, msg: str) -> None:
        del self.notes[:-4]  # the newest readers of a shared cache
        for note in list(self.notes):
            note(msg)

    def disk_bytes(self) -> int:
        """Bytes of the private caches on disk."""
        total = 0
        for p in self.folder.glob("*"):
            try:
                total += p.stat().st_size
            except OSError:
                continue
        return total

    def close(self) -> None:
        with self._sync_lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self.closed = True
        for cache in self.caches.values():
            cache.close()
        self.caches.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            try:  # the last run's cache closed: nothing of gpudash's is left in the staging folder
                self.folder.parent.rmdir()
            except OSError:
                pass

    def sync(self, force: bool = False) -> dict[int, Path]:
        """Fetch what is new; the caches' paths by rank."""
        self.used_at = time.monotonic()
        with self._sync_lock:  # one fetch at a time, however many readers share the cache
            return self._sync_locked(force)

    def _sync_locked(self, force: bool) -> dict[int, Path]:
        if not self.folder.is_dir():  # closed (a shared cache dropped): nothing fetched into a removed folder
            return {rank: c.path for rank, c in self.caches.items()}
        if force or time.monotonic() - self._synced_at >= SYNC_S:
            self._synced_at = time.monotonic()
            try:
                self._sync()
                if self._failed:
                    self._failed = False
                    self._note(f"{self.store.location}: reachable again")
            except Exception as exc:  # noqa: BLE001 - a store that fails is a state: shown, retried next tick
                if not self._failed:
                    self._failed = True
                    self._note(f"{self.store.location}: cannot read the published segments "
                               f"({type(exc).__name__}: {str(exc)[:200]}); showing what was read before")
        return {rank: c.path for rank, c in self.caches.items()}

    def _rank_note(self, rank: int) -> Callable[[str], None]:
        return lambda msg: self._note(f"rank {rank}: {msg}")

    def _sync(self) -> None:
        files = self.store.find(SEGMENTS_DIR)
        for link in self.store.links[:20]:  # never followed, always named
            self._note(f"{link}: a symbolic link; not followed (nothing below a run folder is)")
        present: set[str] = set(files)
        room = True
        for rank, tables in sorted(segment_ranks(files).items()):
            cache = self.caches.get(rank)
            if cache is None:
                try:
                    cache = self.caches[rank] = SegmentCache(self.folder / rank_db_name(rank), self._rank_note(rank))
                except sqlite3.Error as exc:
                    self._note(f"rank {rank}: no room for a private copy of its segments in {self.folder} ({exc})")
                    continue
            note = self._rank_note(rank)
            for table, segments in tables.items():
                if room and not self._fetch_table(cache, table, segments, note):
                    room = False  # the cache is full: no more rows of any table; the ranks' meta still read
            meta = rank_meta_name(rank)
            if meta in present:  # after the rows: a meta that says "finished" comes with all of them
                try:
                    cache.set_meta(self.store.get(meta, limit=META_BYTES))
                except FileNotFoundError:
                    pass
                except Exception as exc:  # noqa: BLE001 - named; the rows are shown
                    note(f"{meta}: {_why(exc)}; the rank's meta is not shown")

    def _fetch_table(self, cache: SegmentCache, table: str, segments: list[tuple[int, int, str]],
                     note: Callable[[str], None]) -> bool:
        """Fetch and ingest the segments of ``table`` that extend the rows held; False when the bounded cache
        has no room for more (:meth:`_fits`)."""
        for after, _last, name in cache.wanted(table, segments):
            if self.bounded and self._full_said and not self._fits():
                return False  # no room: nothing more fetched until some is made
            have = cache.have.get(table, 0)
            if after < have:  # a merged segment over rows held already: only its row groups past them
                if not self._ingest_ranged(cache, table, name, have, note):
                    break
            else:
                try:
                    data = self.store.get(name)
                except FileNotFoundError:
                    break  # merged and removed since the listing: the next listing names the merged file
                except Exception as exc:  # noqa: BLE001 - a link, too large, archived: this table waits, the rest read
                    note(f"{name}: {_why(exc)}; the rows after it wait for a good copy")
                    break
                if not cache.ingest(table, data, name):
                    break
            if self.bounded and not self._fits():
                return False
        return True

    def _ingest_ranged(self, cache: SegmentCache, table: str, name: str, have: int,
                       note: Callable[[str], None]) -> bool:
        """Ingest the row groups of ``name`` that hold rows after ``have``, read in ranges (footer, then those
        groups); False when nothing could be added (said)."""
        import pyarrow.parquet as pq

        from gpudash.store.ranged import open_ranged, rows_after

        try:
            with open_ranged(self.store, name) as f:
                groups = rows_after(pq.ParquetFile(f), have)
                f.seek(0)
                return bool(cache.ingest(table, f, name, size=f.size, row_groups=groups))
        except FileNotFoundError:
            return False  # merged again and removed since the listing: the next listing names the new file
        except Exception as exc:  # noqa: BLE001 - a link, archived, unreadable: this table waits, the rest read
            note(f"{name}: {_why(exc)}; the rows after it wait for a good copy")
            return False

    def _fits(self) -> bool:
        """Whether this run's fetched segments fit the cache's bound, the least recently read runs that are not
        open now dropped to make room (runs open now are kept: while several are, they may hold more than the
        bound together, until they are left); when this run alone does not fit, said once and fetching stops."""
        from gpudash.store.localdisk import cache_limit
        from gpudash.units import human_bytes

        limit = cache_limit()
        make_room(self, limit)
        mine = self.disk_bytes()
        if mine <= limit:
            self._full_said = False
            self.full_note = None
            return True
        if not self._full_said:
            self._full_said = True
            self.full_note = (f"{self.store.location}: the local segment cache is full (this run's segments fetched so "
                       f"far take {human_bytes(mine)}, over the {human_bytes(limit)} limit); showing the rows "
                       "fetched so far: raise the limit (gpudash serve --cache-mb N) to read the rest")
            self._note(self.full_note)
        return False


def _why(exc: BaseException) -> str:
    text = str(exc)[:200] or type(exc).__name__
    return text if isinstance(exc, UnsafeFile) else f"cannot read it ({type(exc).__name__}: {text})"


def unpublished_note(rank: int, meta: dict[str, Any]) -> str:
    """What a crashed rank that published segments left unpublished, and where it is."""
    when = meta.get("published_at") or meta.get("heartbeat")
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(when))) if isinstance(when, (int, float)) else "?"
    where = f"{meta.get('host', '?')}:{meta.get('live_db', '?')}"
    return (f"rank {rank} stopped publishing at {at} (everything up to then is here); what it recorded after "
            f"that is only in its live database {where} and the segments waiting beside it in outbox/")
