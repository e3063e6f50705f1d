"""Run summaries kept on disk, so a server restarted over a folder of 1,000 finished runs lists them at once.

A summary (the runs page's row: :func:`gpudash.server.layouts.runs.run_summary`) is
stored under the run's path with the run's stamp (every file's name, size and
modification time: :func:`gpudash.server.runcache.run_stamp`) and the gpudash
version; any change to a run's files, or another gpudash version, makes it
miss. Only finished and crashed runs are stored (a live run changes every
flush). The store is a SQLite file in ``$GPUDASH_CACHE_DIR`` (default
``$XDG_CACHE_HOME/gpudash``, else ``~/.cache/gpudash``); ``GPUDASH_CACHE_DIR=off``
turns it off. It is a cache: when it cannot be opened or written it is
silently skipped and every summary is computed from the run.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from gpudash._version import __version__

__all__ = ["CACHE_DIR_ENV", "SummaryStore", "cache_dir", "summary_store"]

CACHE_DIR_ENV = "GPUDASH_CACHE_DIR"
#: A summary is a row of the runs page (a few kB; run names and problems are trimmed where read): one larger
#: than this is never kept, nor read back.
MAX_SUMMARY_CHARS = 1 << 20


def cache_dir() -> Path | None:
    """gpudash's cache folder (``$GPUDASH_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpudash`` or ``~/.cache/gpudash``);
    None when turned off."""
    value = os.environ.get(CACHE_DIR_ENV)
    if value is not None:
        return None if value.strip().lower() in ("", "0", "off", "no", "false") else Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpudash"


class SummaryStore:
    """``get(path, stamp)`` / ``put(path, stamp, summary)`` over one SQLite file (thread-safe)."""

    def __init__(self, folder: Path | None) -> None:
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self.problem: str | None = None
        if folder is None:
            return
        try:
            folder.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(folder / "summaries.db", check_same_thread=False, timeout=2)
            conn.execute("PRAGMA synchronous=OFF")  # a cache: a write lost in a power cut is computed again
            conn.execute("CREATE TABLE IF NOT EXISTS summaries (path TEXT PRIMARY KEY, stamp TEXT, "
                         "version TEXT, summary TEXT)")
            conn.commit()
            self._conn = conn
        except (OSError, sqlite3.Error) as exc:
            self.problem = f"{folder}: summary cache unavailable ({exc})"

    @staticmethod
    def _key(path: Path, stamp: tuple[Any, ...]) -> tuple[str, str]:
        return str(Path(path).resolve()), json.dumps(stamp, default=str)

    def get(self, path: Path, stamp: tuple[Any, ...]) -> dict[str, Any] | None:
        if self._conn is None or not stamp:
            return None
        key, want = self._key(path, stamp)
        with self._lock:
            try:
                row = self._conn.execute("SELECT stamp, version, summary FROM summaries WHERE path = ? "
                                         f"AND length(summary) <= {MAX_SUMMARY_CHARS}", (key,)).fetchone()
            except sqlite3.Error:
                return None
        if row is None or row[0] != want or row[1] != __version__:
            return None
        try:
            out = json.loads(row[2])
        except ValueError:
            return None
        return out if isinstance(out, dict) else None

    def put(self, path: Path, stamp: tuple[Any, ...], summary: dict[str, Any]) -> None:
        if self._conn is None or not stamp:
            return
        key, value = self._key(path, stamp)
        try:
            text = json.dumps(summary, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return  # not JSON-safe: computed again next time
        if len(text) > MAX_SUMMARY_CHARS:
            return  # a run whose summary is this large is computed again rather than kept
        with self._lock:
            try:
                with self._conn:
                    self._conn.execute("INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?)",
                                       (key, value, __version__, text))
            except sqlite3.Error:
                pass

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_STORE: tuple[Path | None, SummaryStore] | None = None
_STORE_LOCK = threading.Lock()


def summary_store() -> SummaryStore:
    """The process's store (opened again when ``$GPUDASH_CACHE_DIR`` changed)."""
    global _STORE
    folder = cache_dir()
    with _STORE_LOCK:
        if _STORE is None or _STORE[0] != folder:
            if _STORE is not None:
                _STORE[1].close()
            _STORE = (folder, SummaryStore(folder))
        return _STORE[1]
