"""A folder of runs in an object store, listed without copying it (``gpudash serve s3://...``).

:class:`RunsMirror` lists the prefix (one listing request) and, for every run directly under it (a
folder holding ``run.json`` or ``segments/``), reads only the run's small metadata: ``run.json`` and each
rank's ``meta.json``, each when it changed size or time, all in flight at once. A ``meta.json`` that carries a copy
of its run's ``run.json`` (:func:`gpudash.store.listing.run_json_copy`: the same size, put no later) stands in for
it: a run published by this gpudash costs one read, not two. They are kept in memory
(:mod:`gpudash.store.listed`), never on disk: the local folder the dashboard serves holds only the runs
opened (:func:`gpudash.store.listed.materialize`). No segment is read to list: the runs list (status,
steps, peak memory, duration, ranks: :mod:`gpudash.analysis.listing`) is built from that metadata alone,
and a run's segments are fetched from the store only when the run is opened (its page, ``/api``, a live
run's ``/metrics``, ``load_run``): :func:`origin_of` tells the reader where the run really is,
and :func:`segment_mirror` keeps one private segment cache per opened run (a live run fetches only its
new segments), the least recently used of at most :data:`gpudash.store.mirror.OPEN_RUNS` dropped with its files.

Only names of the published layout count (a run id of safe characters, then ``run.json`` or
``segments/rank=N/meta.json`` or ``segments/rank=N/TABLE/AFTER-LAST.parquet``), each object bounded in
size: whatever else a bucket holds is never fetched.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from gpudash.store.mirror import close_mirrors, forget_origin, open_mirrors, origin_of, segment_mirror, set_origin
from gpudash.store.objstore import Store, open_store, run_name
from gpudash.store.schema import RUN_META_FILE
from gpudash.store.segments import PUBLISHED_TABLES, SEGMENTS_DIR, parse_segment, rank_of_folder

__all__ = ["RunsMirror", "close_mirrors", "mirrored_name", "open_mirrors", "origin_of", "segment_mirror"]

#: Metadata objects fetched at once while listing.
FETCHERS = 32
#: Metadata objects read before the first hand-over of the listing to the dashboard (a first listing of
#: many runs shows every run's name at once, and the newest runs' rows, the first page, whole after the
#: first batch); each later batch twice the one before, at most 8 times this.
LIST_BATCH = 128
def _json_limit(local: str) -> int:
    """The most bytes read of a run's JSON file: what its reader accepts."""
    from gpudash.store.meta import RUN_JSON_BYTES
    from gpudash.store.mirror import META_BYTES

    if local.endswith("/" + RUN_META_FILE):
        return RUN_JSON_BYTES
    return META_BYTES


def mirrored_name(key: str) -> tuple[str, str] | None:
    """(run id, name inside the run) of an object key under the runs prefix, when it is part of the
    published layout; None for anything else."""
    from gpudash.store.runid import valid_run_id

    parts = key.split("/")
    if len(parts) < 2 or not valid_run_id(parts[0]):
        return None
    rest = parts[1:]
    if rest == [RUN_META_FILE]:
        return parts[0], RUN_META_FILE
    if len(rest) < 3 or rest[0] != SEGMENTS_DIR or rank_of_folder(rest[1]) is None:
        return None
    if len(rest) == 3 and rest[2] == "meta.json":
        return parts[0], "/".join(rest)
    if len(rest) == 4 and rest[2] in PUBLISHED_TABLES and parse_segment(rest[3]) is not None:
        return parts[0], "/".join(rest)
    return None


class RunsMirror:
    """Keeps ``local`` in step with the runs under ``location`` (a URL), every ``every_s`` seconds."""

    def __init__(self, location: str, local: Path, every_s: float = 2.0) -> None:
        self.store: Store = open_store(location)
        self.local = local
        self.every_s = every_s
        self.errors: list[str] = []
        #: "RUN/NAME" -> (the object's identity when read, its bytes, or why it was not read)
        self._seen: dict[str, tuple[Any, bytes | None, str | None]] = {}
        self._runs: set[str] = set()  # the runs the last listing found
        self._origins: dict[str, str] = {}  # run id -> its URL, as told to gpudash.store.mirror
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the id the prefix itself has when it is a run (``s3://b/runs/exp1`` holding ``run.json``)
        self.own_id = run_name(location)
        local.mkdir(parents=True, exist_ok=True)

    def sync_once(self) -> int:
        """Read the metadata that changed (``run.json``, each rank's ``meta.json``; never a segment) into
        memory (:mod:`gpudash.store.listed`: nothing is written to disk to list a run); returns objects read.
        A failing listing raises (the caller says so); one object that cannot be read is named in
        :attr:`errors` (once), its run listed with what else it has, and it is retried next time."""
        self.store.fs.invalidate_cache(self.store.root)  # a live run's listing changes: never from a cache
        listing = self.store.fs.find(self.store.root, detail=True)
        root = self.store.root.rstrip("/") + "/"
        wanted: dict[str, tuple[str, Any, int]] = {}
        times: dict[str, Any] = {}  # "RUN/NAME" -> when the store last wrote it (as the listing says)
        runs: dict[str, str] = {}  # run id -> its URL in the store
        own: set[str] = set()  # the prefix's own files (it is a run itself)
        clash = False
        for full, info in listing.items():
            key = str(full)[len(root):] if str(full).startswith(root) else None
            named = self._named(key) if key else None
            if key is None or named is None:
                continue
            if named[0] == self.own_id and mirrored_name(key) is None:
                own.add(f"{named[0]}/{named[1]}")
            elif named[0] == self.own_id:
                clash = True
            runs.setdefault(named[0], f"{self.store.location}/{named[0]}" if key.startswith(f"{named[0]}/")
                            else self.store.location)
            if not (named[1] == RUN_META_FILE or named[1].endswith("/meta.json")):
                continue  # a segment: fetched when its run is opened, never to list
            local = f"{named[0]}/{named[1]}"
            size = int(info.get("size") or 0)
            ident = (size, str(info.get("LastModified") or info.get("mtime") or info.get("ETag")))
            wanted[local] = (key, ident, size)
            times[local] = info.get("LastModified") or info.get("mtime")
        if clash:  # a run under the prefix has the prefix's own name: that run is the one shown
            wanted = {k: v for k, v in wanted.items() if k not in own}
            runs[self.own_id] = f"{self.store.location}/{self.own_id}"
        todo: list[tuple[str, str, int, int]] = []
        for local, (key, ident, size) in sorted(wanted.items()):
            held = self._seen.get(local)
            if held is not None and held[0] == ident:
                continue
            limit = _json_limit(local)
            if size > limit:  # listed, and its reader names the file as too large (the run never vanishes)
                self._seen[local] = (ident, None, f"{size:,} bytes, over the {limit:,} read at most; not read")
                self._say(f"{self.store.location}/{key}: {size:,} bytes, over the {limit:,} read at most; "
                          "not copied (the run shows it as damaged)")
                continue
            todo.append((local, key, size, limit))
        copied = 0
        for local in [n for n in self._seen if n not in wanted]:
            del self._seen[local]  # removed upstream
        # newest runs first (by the time the listing gives their objects): the first page of the list,
        # newest first, is whole after the first batch; every run is named from the listing at once
        newest: dict[str, str] = {}
        for local, (_key, ident, _size) in wanted.items():
            run_id = local.split("/", 1)[0]
            newest[run_id] = max(newest.get(run_id, ""), str(ident[1]))
        todo.sort(key=lambda item: (newest[item[0].split("/", 1)[0]], item[0]), reverse=True)
        ranks: dict[str, list[str]] = {}  # run id -> its ranks' meta.json ("RUN/NAME")
        for local in wanted:
            if local.endswith("/meta.json"):
                ranks.setdefault(local.split("/", 1)[0], []).append(local)
        start, batch = 0, LIST_BATCH
        known = {local.split("/", 1)[0] for local in self._seen}  # runs listed before: never said pending again
        while start < len(todo):
            if start or len(todo) > batch:
                self._publish(runs, {item[0].split("/", 1)[0] for item in todo[start:]} - known)
            chunk = todo[start:start + batch]
            start, batch = start + batch, min(8 * LIST_BATCH, 2 * batch)  # fewer hand-overs as it goes on
            # each rank's meta.json first; a run.json only where no meta.json carries its copy
            copied += self._read([item for item in chunk if item[0].endswith("/meta.json")], wanted)
            copied += self._read([item for item in chunk if not item[0].endswith("/meta.json")
                                  and not self._from_copy(item[0], wanted, times, ranks)], wanted)
        self._publish(runs, set())
        for run_id in self._runs - set(runs):  # a run deleted from the store leaves the list (and its folder)
            import shutil

            forget_origin(self.local / run_id)
            self._origins.pop(run_id, None)
            shutil.rmtree(self.local / run_id, ignore_errors=True)
        self._runs = set(runs)
        return copied

    def _read(self, todo: list[tuple[str, str, int, int]], wanted: dict[str, tuple[str, Any, int]]) -> int:
        """Fetch ``todo`` into what is held; the number of objects read."""
        copied = 0
        for (local, key, _size, _limit), data in zip(todo, self._fetch(todo) if todo else [], strict=True):
            if isinstance(data, FileNotFoundError):
                continue  # removed since the listing
            if isinstance(data, BaseException):  # archived, denied, ...: one object never stops the rest
                self._say(f"{self.store.location}/{key}: cannot read it ({type(data).__name__}: "
                          f"{str(data)[:200]}); the other objects are copied, this one is retried")
                continue
            self._seen[local] = (wanted[local][1], data, None)
            copied += 1
        return copied

    def _from_copy(self, local: str, wanted: dict[str, tuple[str, Any, int]], times: dict[str, Any],
                   ranks: dict[str, list[str]]) -> bool:
        """Hold the run's ``run.json`` (``local``) from the copy a rank's ``meta.json`` carries, when one does
        and it is that object: the same size, and the ``meta.json`` written no earlier than it (a ``run.json``
        changed since, or a run of an older gpudash: False, it is read itself)."""
        from gpudash.store.listing import run_json_copy

        run_id = local.split("/", 1)[0]
        written = times.get(local)
        if written is None:
            return False
        for name in ranks.get(run_id, []):
            data = self._seen[name][1] if name in self._seen else None
            copy = None if data is None else run_json_copy(data)
            if copy is None or copy[0] != wanted[local][2]:
                continue
            try:
                later = times.get(name) is not None and times[name] >= written
            except TypeError:  # times the listing gives in two forms: not compared, the run.json is read
                later = False
            if later:
                self._seen[local] = (wanted[local][1], copy[1], None)
                return True
        return False

    def _publish(self, runs: dict[str, str], pending: set[str]) -> None:
        """Hand the listing to the dashboard (:func:`gpudash.store.listed.set_listing`; ``pending``: runs whose
        metadata is still being read); opened runs' folders get their new ``run.json``."""
        from gpudash.store.listed import ListedRun, listed_run, materialize, set_listing

        by_run: dict[str, list[tuple[str, tuple[Any, bytes | None, str | None]]]] = {}
        for local, held in self._seen.items():
            run_id, name = local.split("/", 1)
            by_run.setdefault(run_id, []).append((name, held))
        listed: dict[str, ListedRun] = {}
        for run_id, url in runs.items():
            run_json = None
            hole = None
            metas: dict[int, bytes] = {}
            problems = []
            stamp = []
            for name, (ident, data, problem) in sorted(by_run.get(run_id, [])):
                stamp.append((name, ident))
                if problem is not None:
                    problems.append(f"{name}: {problem}")
                    if name == RUN_META_FILE:
                        hole = int(ident[0])
                elif name == RUN_META_FILE:
                    run_json = data
                else:
                    rank = rank_of_folder(name.split("/")[1])
                    if rank is not None and data is not None:
                        metas[rank] = data
            listed[run_id] = ListedRun(url=url, run_json=run_json, metas=metas, problems=tuple(problems),
                                       stamp=tuple(stamp), run_json_size=hole,
                                       pending=run_id in pending)
            if self._origins.get(run_id) != url:  # once a run (each resolves its path)
                set_origin(self.local / run_id, url)
                self._origins[run_id] = url
        try:
            opened = sorted({p.name for p in self.local.iterdir()} & set(runs))
        except OSError:
            opened = []
        set_listing(self.local, listed)
        for run_id in opened:
            if listed_run(self.local / run_id) is not None:
                materialize(self.local / run_id)  # an opened run: its run.json as now listed

    def _fetch(self, todo: list[tuple[str, str, int, int]]) -> list[bytes | BaseException]:
        """The objects' bytes (or what reading each raised), many requests in flight at once: a listing
        of a thousand runs waits for the slowest few requests, not for the sum of them all. An object
        store with an asynchronous driver (s3fs, gcsfs, adlfs) gets them all in one batch of ranged
        reads on its event loop (:data:`FETCHERS` at once); another, from a pool of threads."""
        if not todo:
            return []
        fs = self.store.fs
        if self.store.remote and getattr(fs, "async_impl", False):
            root = self.store.root.rstrip("/")
            fulls = [f"{root}/{key}" for _local, key, _size, _limit in todo]
            got = fs.cat_ranges(fulls, [0] * len(todo), [limit + 1 for *_x, limit in todo], on_error="return",
                                batch_size=FETCHERS)
            out: list[bytes | BaseException] = []
            for (_local, key, _size, limit), data in zip(todo, got, strict=True):
                if isinstance(data, BaseException):
                    out.append(data)
                elif len(data) > limit:  # replaced by a larger object since the listing
                    out.append(OSError(f"{key} is over the {limit:,} bytes read at most; not read"))
                else:
                    out.append(bytes(data))
            return out
        from concurrent.futures import ThreadPoolExecutor

        def one(item: tuple[str, str, int, int]) -> bytes | BaseException:
            _local, key, size, limit = item
            try:  # the size the listing gave: one request an object
                return self.store.get(key, limit=limit, size=size)
            except Exception as exc:  # noqa: BLE001 - returned: said per object by the caller
                return exc

        if len(todo) == 1:
            return [one(todo[0])]
        with ThreadPoolExecutor(max_workers=min(FETCHERS, len(todo)), thread_name_prefix="gpudash-list") as pool:
            return list(pool.map(one, todo))

    def _named(self, key: str) -> tuple[str, str] | None:
        """(run id, name inside the run) of a key: a run under the prefix, or the prefix itself when it is a
        run (its files kept under the prefix's own name). Never anything outside the prefix asked for."""
        named = mirrored_name(key)
        if named is not None:
            return named
        own = mirrored_name(f"{self.own_id}/{key}")
        if own is not None and not key.startswith(f"{self.own_id}/"):
            return own
        return None

    def _say(self, msg: str) -> None:
        if msg in self.errors:
            return
        self.errors.append(msg)
        del self.errors[:-100]  # bounded: the newest hundred
        import sys

        from gpudash.terminal import printable

        print(f"gpudash: {printable(msg)}", file=sys.stderr)

    def start(self) -> None:
        """Sync at once and then every ``every_s`` seconds, in a thread (a bucket of many objects never delays
        the caller: the server binds its port while the first listing runs); a failure is one line in
        :attr:`errors`."""
        self._thread = threading.Thread(target=self._loop, name="gpudash-runs-mirror", daemon=True)
        self._thread.start()

    def _sync_logged(self) -> None:
        try:
            self.sync_once()
        except Exception as exc:  # noqa: BLE001 - a store that fails is a state: said once, retried
            msg = f"{self.store.location}: cannot list the runs ({type(exc).__name__}: {str(exc)[:200]})"
            if msg not in self.errors:
                self.errors.append(msg)
                import sys

                print(f"gpudash: {msg}; retrying every {self.every_s:g} s", file=sys.stderr)

    def _loop(self) -> None:
        self._sync_logged()
        while not self._stop.wait(self.every_s):
            self._sync_logged()

    def stop(self) -> None:
        from gpudash.store.listed import drop_listing

        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        drop_listing(self.local)
