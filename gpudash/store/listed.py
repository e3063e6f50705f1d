"""Runs of an object store listed in memory: what the runs list knows of a run that was never opened.

:class:`gpudash.store.runsync.RunsMirror` lists a prefix and reads each run's small metadata (``run.json``
and each rank's ``meta.json``); it keeps them here, in this process's memory, under the local folder the
dashboard serves (``ROOT``): nothing is written to disk to list a run. :func:`gpudash.store.runid.list_run_dirs`
names the runs listed under ``ROOT`` (``ROOT/<id>``, a folder that does not exist yet), the runs list reads
their metadata from :func:`listed_run`, and a run's folder is made only when the run is opened
(:func:`materialize`: the folder and its ``run.json``; its segments are fetched into the segment cache of
:mod:`gpudash.store.mirror`). So the local disk holds the opened runs' bytes, never the bucket's listing.

A listed run's stamp (:func:`gpudash.server.runcache.run_stamp`) is the identity the listing gave its metadata
objects (size and time of each): a run that published again is read again, one that did not is not.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudash.store.schema import RUN_META_FILE
from gpudash.store.segments import SEGMENTS_DIR

__all__ = ["ListedRun", "drop_listing", "listed_root", "listed_run", "listed_runs", "materialize", "set_listing"]


@dataclass(frozen=True)
class ListedRun:
    """One run as the last listing found it: its URL, ``run.json``'s bytes (None: absent, or over what is
    read: then ``run_json_size`` is its size), each rank's ``meta.json`` bytes, what could not be read
    (``problems``), and ``stamp`` (changes when any of them does)."""

    url: str
    run_json: bytes | None
    metas: dict[int, bytes] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    stamp: tuple[Any, ...] = ()
    run_json_size: int | None = None
    #: named by the listing, its metadata not read yet (a first listing of many runs: the newest read first)
    pending: bool = False


_LOCK = threading.Lock()
#: local folder served (as given, and resolved) -> run id -> the run as listed
_ROOTS: dict[Path, dict[str, ListedRun]] = {}


def set_listing(root: Path, runs: dict[str, ListedRun]) -> None:
    """The runs listed under ``root`` now (the whole listing: a run missing from it is gone)."""
    with _LOCK:
        _ROOTS[Path(root)] = runs
        _ROOTS[Path(root).resolve()] = runs


def drop_listing(root: Path) -> None:
    with _LOCK:
        _ROOTS.pop(Path(root), None)
        _ROOTS.pop(Path(root).resolve(), None)


def listed_runs(root: Path) -> dict[str, ListedRun] | None:
    """The runs listed under ``root`` (None: ``root`` is an ordinary folder)."""
    if not _ROOTS:
        return None
    found = _ROOTS.get(Path(root))
    if found is None:
        try:
            found = _ROOTS.get(Path(root).resolve())
        except OSError:
            return None
    return found


def listed_root(root: Path) -> Path | None:
    """``root`` as the listing names it (the folder its runs' paths start with), or None."""
    if not _ROOTS:
        return None
    for key in (Path(root), Path(root).resolve()):
        if key in _ROOTS:
            return key
    return None


def listed_run(path: Path) -> ListedRun | None:
    """The listed run whose folder is ``path`` (opened or not), or None for any other folder."""
    if not _ROOTS:
        return None
    path = Path(path)
    runs = _ROOTS.get(path.parent)
    if runs is None:
        try:
            path = path.resolve()
        except OSError:
            return None
        runs = _ROOTS.get(path.parent)
    return None if runs is None else runs.get(path.name)


def materialize(path: Path) -> bool:
    """Make the folder of the listed run at ``path`` as it is opened: the folder, its ``run.json`` (as
    listed) and an empty ``segments/`` (its segments are fetched by the reader). False when ``path`` is not
    a listed run. Written whole (a temporary name, then a rename); a ``run.json`` that changed upstream is
    written again (:func:`gpudash.store.atomic.write_atomic`)."""
    run = listed_run(path)
    if run is None:
        return False
    path = Path(path)
    (path / SEGMENTS_DIR).mkdir(parents=True, exist_ok=True)
    dest = path / RUN_META_FILE
    if run.run_json is None and run.run_json_size is None:
        return True
    try:
        if run.run_json is None and dest.stat().st_size == run.run_json_size:
            return True
        if run.run_json is not None and dest.read_bytes() == run.run_json:
            return True
    except OSError:
        pass
    from gpudash.store.atomic import write_atomic

    # too large to read: a hole of its size (None), which the reader names as such
    write_atomic(dest, run.run_json, root=path.parent, size=run.run_json_size or 0)
    return True
